"""A reward function written for TRL, used unchanged (no registration: named by path).

    swift rlhf --rlhf_type grpo --reward_funcs examples/plugins/trl_reward.py:brevity ...
    swift rlhf --rlhf_type grpo --reward_funcs my_package.rewards.brevity ...   # TRL's dotted form

It is called TRL's way: keywords `prompts`, `completions`, `completion_ids` and every other dataset
column; conversational rows give lists of messages, text-prompt rows give strings.
"""


def brevity(prompts, completions, completion_ids, **kwargs):
    return [1.0 / (1 + len(ids)) for ids in completion_ids]

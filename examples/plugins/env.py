"""A gym-style environment for the `gym` multi-turn scheduler: the model must answer the row's sum;
a wrong answer gets "try again" (up to --max_turns), a right one reward 1.

    swift rlhf --rlhf_type grpo --external_plugins examples/plugins/env.py \
        --multi_turn_scheduler gym --gym_env retry_sum --max_turns 2 --reward_funcs gym_reward ...
"""
from swift.plugin import register
from swift.rollout.multi_turn import Env


@register("env", "retry_sum")
class RetrySum(Env):
    def reset(self, data_dict):
        self.answer = str(data_dict["solution"]).strip()
        return ""  # the row's own prompt starts the episode

    def step(self, action):
        if action.strip() == self.answer:
            return "", 1.0, True, {}
        return "Wrong, try again.", 0.0, False, {}

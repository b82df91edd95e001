"""What the online trainer's reward functions receive, as ms-swift's GRPO hands it: `messages` the
whole conversation with the answer last (`messages[-1]['content']` is the prediction) and
`rollout_infos` one dict per row; TRL-style functions still get `prompts` / `completions`. Before
2026-11-30 `messages` was the prompt alone and there was no `rollout_infos` column (end to end:
tests/rollout/test_loss_scale.py)."""
import io
import json

from swift.rewards.manager import RemoteRewardModel, RewardManager, TRLReward, whole_conversations

PROMPT = [{"role": "user", "content": "guess"}]
TURNS = [*PROMPT, {"role": "assistant", "content": "40"}, {"role": "user", "content": "higher"},
         {"role": "assistant", "content": "52"}, {"role": "user", "content": "(the budget ran out)"}]
SINGLE = [*PROMPT, {"role": "assistant", "content": "51"}]


def columns():  # as the trainer's Rollout.score builds them
    return whole_conversations(["52", "51"], {"messages": [PROMPT, PROMPT], "trajectory_messages": [TURNS, SINGLE],
                                              "rollout_infos": [{"bonus": 0.5}, {}]})


def ms_swift_reward(completions, messages, rollout_infos, **kwargs):
    return [float(m[-1]["content"] == "52") + info.get("bonus", 0.0) for m, info in zip(messages, rollout_infos)]


def test_messages_end_with_the_answer_and_prompts_stay_prompts():
    seen = {}

    def trl_reward(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions, kwargs=sorted(kwargs))
        return [0.0, 0.0]

    manager = RewardManager([("ms", ms_swift_reward), ("trl", TRLReward(trl_reward, "trl"))])
    totals, _ = manager(["52", "51"], columns())
    assert totals == [1.5, 0.0]  # the trajectory is cut after its last answer
    assert seen["prompts"] == [PROMPT, PROMPT] and seen["completions"] == [TURNS[1:], SINGLE[1:]]
    assert not {"messages", "rollout_infos", "prompt_messages"} & set(seen["kwargs"])


def test_a_reward_model_scores_the_whole_conversation_once(monkeypatch):
    sent = []

    def urlopen(request, timeout=None):
        sent.append(json.loads(request.data))
        return io.StringIO(json.dumps({"rewards": [0.0] * len(sent[-1]["messages"])}))

    monkeypatch.setattr("urllib.request.urlopen", urlopen)
    RemoteRewardModel("http://localhost:1")(["52", "51"], **columns())
    assert sent[-1]["messages"] == [TURNS[:4], SINGLE]
    RemoteRewardModel("http://localhost:1")(["7"], messages=[PROMPT])  # `swift sample`: the prompt alone
    assert sent[-1]["messages"] == [[*PROMPT, {"role": "assistant", "content": "7"}]]

"""`--loss_scale` on multi-turn online RL (as ms-swift): `default` trains every generated turn,
`last_round` the final assistant message alone; the default is `default` with a trainer-side
--multi_turn_scheduler and `last_round` otherwise (a rollout server's scheduler included). Before
2026-11-30 the flag was never read here: every generated token of every turn carried loss."""
import json
import textwrap

import pytest

from swift.infer.protocol import RequestConfig
from swift.rollout.multi_turn import RolloutInferRequest, build_scheduler
from swift.rollout.runner import rollout
from swift.template import get_template
from swift.utils.registry import SwiftError
from tests.conftest import train_argv
from tests.rollout.test_multi_turn import ScriptedEngine, generated_text


def guess(tokenizer, loss_scale, script=("40", "60", "52")):
    engine = ScriptedEngine(tokenizer, list(script))
    request = RolloutInferRequest([{"role": "user", "content": "guess"}], {"solution": "52"})
    t, = rollout(engine, get_template("chatml", tokenizer, loss_scale=loss_scale), [request],
                 RequestConfig(max_tokens=8), 1, scheduler=build_scheduler("gym", max_turns=5, env="guess_number"),
                 max_completion_length=64)
    return t


def test_last_round_trains_the_final_answer_and_default_every_turn(tokenizer):
    every, last = guess(tokenizer, "default"), guess(tokenizer, "last_round")
    assert every.completion_ids == last.completion_ids and every.turns == last.turns == 3
    assert generated_text(tokenizer, every) == "40<|im_end|>60<|im_end|>52<|im_end|>"
    assert generated_text(tokenizer, last) == "52<|im_end|>"
    assert tokenizer.decode(last.completion_ids[last.last_round:]) == "52<|im_end|>"


def test_last_round_keeps_a_continued_answer_whole(tokenizer):
    """math_tip_trick continues the same assistant message: both turns are the final message."""
    outs = {}
    for scale in ("default", "last_round"):
        engine = ScriptedEngine(tokenizer, ["<think>hm</think><answer>51</answer>", " 52"])
        request = RolloutInferRequest([{"role": "user", "content": "07+45="}], {"solution": "52"})
        outs[scale], = rollout(engine, get_template("chatml", tokenizer, loss_scale=scale), [request],
                               RequestConfig(max_tokens=32), 1, scheduler=build_scheduler("math_tip_trick", 3),
                               max_completion_length=128)
    assert outs["last_round"].turns == 2 and outs["last_round"].loss_mask == outs["default"].loss_mask
    assert "<think>hm" in generated_text(tokenizer, outs["last_round"])


def test_a_rollout_servers_trajectories_honour_the_trainers_loss_scale(tokenizer):
    """The server's worker rolls out with its own template (loss_scale default) and replies with
    where the final message starts; the trainer's client masks by its own --loss_scale."""
    from swift.rollout.client import RolloutClient
    from swift.rollout.worker import as_reply

    served = guess(tokenizer, "default")  # what the server's worker produces
    reply = json.loads(json.dumps([{"choices": [as_reply(served)]}]))
    client = object.__new__(RolloutClient)  # no server: its /infer/ answer is the reply above
    client._post = lambda path, body=None, timeout=None: reply
    request = RolloutInferRequest([{"role": "user", "content": "guess"}], {"solution": "52"})
    for scale, trained in (("last_round", "52<|im_end|>"), ("default", "40<|im_end|>60<|im_end|>52<|im_end|>")):
        t, = rollout(client, get_template("chatml", tokenizer, loss_scale=scale), [request], RequestConfig(), 1)
        assert t.completion_ids == served.completion_ids and generated_text(tokenizer, t) == trained


def args(**kwargs):
    from swift.arguments.rlhf import RLHFArguments

    return RLHFArguments(model="m", dataset=["d"], **{"reward_funcs": ["accuracy"], **kwargs})


@pytest.mark.parametrize("kwargs,expected", [
    ({"rlhf_type": "grpo"}, "last_round"),
    ({"rlhf_type": "grpo", "multi_turn_scheduler": "gym"}, "default"),  # ms-swift's default with a scheduler
    ({"rlhf_type": "ppo", "multi_turn_scheduler": "gym"}, "default"),
    ({"rlhf_type": "harmless", "harmlessness_training_loss_type": "reinforce", "multi_turn_scheduler": "gym"},
     "default"),
    ({"rlhf_type": "grpo", "multi_turn_scheduler": "gym", "loss_scale": "last_round"}, "last_round"),
    ({"rlhf_type": "grpo", "rollout_mode": "server"}, "last_round"),  # the server's scheduler: as ms-swift
    ({"rlhf_type": "grpo", "rollout_mode": "server", "loss_scale": "default"}, "default"),  # ms-swift's vllm_gym.sh
    ({"rlhf_type": "dpo", "reward_funcs": []}, "last_round"),
])
def test_the_default_loss_scale_follows_ms_swift(kwargs, expected):
    assert args(**kwargs).loss_scale == expected


@pytest.mark.parametrize("kwargs,message", [
    ({"rlhf_type": "grpo", "multi_turn_scheduler": "gym", "loss_scale": "all"},
     r"^--loss_scale all does not apply to --rlhf_type grpo \(it trains on the tokens it generates"),
    ({"rlhf_type": "grpo", "loss_scale": "default"},
     r"^--loss_scale default does not apply to --rlhf_type grpo \(without a --multi_turn_scheduler"),
])
def test_loss_scales_nothing_reads_are_refused(kwargs, message):
    with pytest.raises(SwiftError, match=message):
        args(**kwargs)


RECORDER = '''
import json, os
from swift.rewards import ORM, orms
from swift.rollout.multi_turn import MultiTurnScheduler, multi_turns

class Twice(MultiTurnScheduler):
    """Two answers: the first cut to its start (room left in the budget), then "again"."""
    def check_finished(self, infer_request, response_choice, current_turn):
        return current_turn >= 2

    def step(self, infer_request, response_choice, current_turn):
        infer_request.messages[-1] = {"role": "assistant", "content": infer_request.messages[-1]["content"][:12]}
        infer_request.messages.append({"role": "user", "content": "again"})
        return {"infer_request": infer_request, "rollout_infos": {"cut_after_turn": current_turn}}

class MsSwiftStyle(ORM):
    """An ms-swift reward plugin: the prediction is messages[-1]['content']; rollout_infos one dict per row."""
    def __call__(self, completions, messages, rollout_infos, response_token_ids, **kwargs):
        with open(os.environ["REWARD_LOG"], "a") as f:
            for c, m, info, ids in zip(completions, messages, rollout_infos, response_token_ids):
                f.write(json.dumps({"completion": c, "messages": m, "info": info, "ids": ids}) + "\\n")
        return [float(len(m[-1]["content"])) for m in messages]

multi_turns["twice"] = Twice
orms["ms_swift_style"] = MsSwiftStyle
'''


@pytest.mark.parametrize("loss_scale", ["last_round", None])
def test_grpo_with_a_scheduler_trains_by_loss_scale_and_rewards_see_ms_swifts_columns(
        tmp_path, monkeypatch, tokenizer, loss_scale):
    """End to end, two turns per trajectory. Reward functions get `messages` as the whole conversation
    with the answer last and `rollout_infos` (with what the scheduler's step() returned) per row
    (before 2026-11-30: the prompt alone, no rollout_infos, step()'s rollout_infos dropped); the
    tokens that carry loss (`response_token_ids`) are the final answer's under last_round and also
    the first turn's under the default (default, with the trainer's scheduler)."""
    from swift.pipelines.rlhf import rlhf_main

    (tmp_path / "ms_plugin.py").write_text(RECORDER)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("REWARD_LOG", str(log))
    rlhf_main(train_argv(tmp_path / "out", "--rlhf_type", "grpo", "--dataset", "builtin:arith-sft#4",
                         "--num_generations", "2", "--per_device_train_batch_size", "4",
                         "--max_completion_length", "24", "--max_steps", "1", "--temperature", "1.0",
                         "--multi_turn_scheduler", "twice", "--external_plugins", str(tmp_path / "ms_plugin.py"),
                         "--reward_funcs", "ms_swift_style", *(["--loss_scale", loss_scale] if loss_scale else [])))
    rows = [json.loads(line) for line in open(log)]
    assert len(rows) == 4
    for row in rows:
        assert row["messages"][0]["role"] == "user" and row["messages"][-2] == {"role": "user", "content": "again"}
        assert row["messages"][-1] == {"role": "assistant", "content": row["completion"]}
        assert row["info"] == {"cut_after_turn": 1}
        trained = tokenizer.decode(row["ids"])
        assert trained.endswith((row["completion"], row["completion"] + "<|im_end|>"))
        if loss_scale == "last_round":
            assert trained in (row["completion"], row["completion"] + "<|im_end|>")
    if loss_scale is None:  # the first answer's kept start trains too
        assert any(len(tokenizer.decode(r["ids"])) > len(r["completion"] + "<|im_end|>") for r in rows)

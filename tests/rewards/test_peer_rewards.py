"""Reward functions written for TRL and verl, loaded as their users name them and called with the
arguments those tools pass, through a real `swift rlhf --rlhf_type grpo` run: what each function
received is recorded by the function itself and compared with the run's data and logged completions."""
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from swift.pipelines.rlhf import rlhf_main
from swift.utils.registry import SwiftError
from tests.conftest import train_argv

RECORDER = '''
import json, os

def _record(name, **kw):
    with open(os.environ["REWARD_LOG"], "a") as f:
        f.write(json.dumps({"name": name, **kw}, default=str) + "\\n")

def length_reward(prompts, completions, completion_ids, trainer_state=None, log_metric=None, **kwargs):
    """TRL: one float per completion (None for the first: no reward for that row)."""
    _record("length_reward", prompts=prompts, completions=completions, completion_ids=completion_ids,
            columns=sorted(kwargs), step=trainer_state.global_step)
    log_metric("length_reward_calls", 1.0)
    text = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [None if i == 0 else float(len(t)) for i, t in enumerate(text)]

def my_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl: called per completion; a dict gives its score."""
    _record("my_score", data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
            extra_info=extra_info)
    return {"score": float(solution_str.strip() == str(ground_truth)) + 0.5, "acc": 1.0}
'''


def grpo(tmp_path, data, *extra):
    return rlhf_main(train_argv(tmp_path / "out", "--rlhf_type", "grpo", "--dataset", str(data),
                                "--num_generations", "2", "--per_device_train_batch_size", "4",
                                "--max_completion_length", "4", "--temperature", "1.0", "--max_steps", "1",
                                "--log_completions", "true", "--save_strategy", "no", *extra))


def records(path, name):
    return [r for r in map(json.loads, open(path)) if r["name"] == name]


@pytest.fixture
def recorder(tmp_path, monkeypatch):
    (tmp_path / "peer_rewards.py").write_text(RECORDER)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("REWARD_LOG", str(log))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield log
    sys.modules.pop("peer_rewards", None)  # imported by name (a dotted path): the next test's file is another


def completions_of(tmp_path):
    (path,) = (tmp_path / "out").rglob("completions.jsonl")
    return [json.loads(line) for line in open(path)]


def test_trl_reward_on_a_standard_dataset_gets_text_prompts_and_completions(tmp_path, recorder):
    rows = [{"prompt": f"{a:02d}+{b:02d}=", "solution": str(a + b)} for a, b in [(1, 2), (30, 4), (5, 6), (7, 70)]]
    data = tmp_path / "standard.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    grpo(tmp_path, data, "--reward_funcs", f"{tmp_path}/peer_rewards.py:length_reward")
    (call,) = records(recorder, "length_reward")
    assert set(call["prompts"]) <= {r["prompt"] for r in rows} and len(call["prompts"]) == 4
    assert all(isinstance(c, str) for c in call["completions"])
    assert "solution" in call["columns"] and "messages" not in call["columns"] and "prompt" not in call["columns"]
    assert call["step"] == 0 and "log_extra" in call["columns"]  # the trainer's state, TRL's logging hooks
    (log,) = [r for r in map(json.loads, open(tmp_path / "out" / "logging.jsonl")) if "loss" in r]
    assert log["length_reward_calls"] == 1.0
    logged = completions_of(tmp_path)
    assert sorted(r["completion"] for r in logged) == sorted(call["completions"])
    scores = [r["rewards/length_reward"] for r in logged]
    assert sorted(v for v in scores if v is not None and v == v) == sorted(float(len(c)) for c in call["completions"][1:])


def test_trl_reward_by_dotted_path_on_a_conversational_dataset(tmp_path, recorder):
    grpo(tmp_path, "builtin:arith-sft#4", "--reward_funcs", "peer_rewards.length_reward")
    (call,) = records(recorder, "length_reward")
    assert all(p[-1]["role"] == "user" and p[-1]["content"].endswith("=") for p in call["prompts"])
    assert all(c[0]["role"] == "assistant" for c in call["completions"])
    assert all(isinstance(ids, list) for ids in call["completion_ids"])


def test_verl_compute_score_gets_verls_arguments_from_a_verl_parquet(tmp_path, recorder):
    rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": f"{a:02d}+{b:02d}="}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(a + b)}, "extra_info": {"index": i}}
            for i, (a, b) in enumerate([(1, 2), (30, 4), (5, 6), (7, 70)])]
    data = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    grpo(tmp_path, data, "--custom_reward_function_path", f"{tmp_path}/peer_rewards.py",
         "--custom_reward_function_name", "my_score")
    calls = records(recorder, "my_score")
    assert len(calls) == 4 and {c["data_source"] for c in calls} == {"arith"}
    truth = {r["extra_info"]["index"]: r["reward_model"]["ground_truth"] for r in rows}
    assert all(c["ground_truth"] == truth[c["extra_info"]["index"]] for c in calls)
    logged = completions_of(tmp_path)
    for c in calls:
        (row,) = [r for r in logged if r["completion"] == c["solution_str"]][:1]
        assert row["rewards/my_score"] == float(c["solution_str"].strip() == c["ground_truth"]) + 0.5


def test_peer_reward_names_that_do_not_resolve_say_so(tmp_path, recorder):
    from swift.rewards.manager import build_reward_funcs

    with pytest.raises(SwiftError, match="no_such_module.func: cannot import"):
        build_reward_funcs(["no_such_module.func"])
    with pytest.raises(SwiftError, match="defines no missing"):
        build_reward_funcs([f"{tmp_path}/peer_rewards.py:missing"])

    class Args:
        custom_reward_function_path, custom_reward_function_name = str(tmp_path / "peer_rewards.py"), "nope"

    with pytest.raises(SwiftError, match="defines no function nope"):
        build_reward_funcs([], Args())


def test_trl_reward_sees_every_turn_of_a_multi_turn_trajectory():
    """As TRL hands an environment rollout's completion: the messages after the prompt, tool calls
    and results included; the prompt as generated from (an environment may have extended it)."""
    from swift.rewards.manager import TRLReward

    seen = {}

    def reward(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [1.0]

    prompt = [{"role": "user", "content": "Add 4 and 9."}]
    turns = [{"role": "user", "content": "Add 4 and 9. (observation)"},
             {"role": "assistant", "content": '<tool_call>{"name": "add", "arguments": {"a": 4, "b": 9}}</tool_call>'},
             {"role": "tool", "name": "add", "content": "13"}, {"role": "assistant", "content": "13"}]
    TRLReward(reward, "reward")(["13"], messages=[prompt], trajectory_messages=[turns], solution=["13"])
    assert seen == {"prompts": [turns[:1]], "completions": [turns[1:]]}

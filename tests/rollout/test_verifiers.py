"""prime-rl `verifiers` environments (classic API, verifiers 0.3.1), written in verifiers' documented
format: their datasets load as rows, their own rollout loop runs with our engine as the model
(single-turn, MultiTurnEnv.env_response, ToolEnv's tools), environment tokens carry no loss, and the
rubric's weighted total is the reward of a GRPO step."""
import json
import os

import pytest

from swift.pipelines.rlhf import rlhf_main
from swift.utils.registry import SwiftError
from tests.conftest import train_argv

ENV = '''
import json, os, re

import verifiers as vf
from datasets import Dataset

SYSTEM = "Answer inside <answer></answer> tags."


def rows(n):
    return [{"question": f"{i + 2}+{3 * i + 1}=", "answer": str(4 * i + 3), "info": {"i": i}} for i in range(n)]


def load_environment(n: int = 4, kind: str = "single", **kwargs):
    parser = vf.XMLParser(["answer"], answer_field="answer")

    async def correct(completion, answer, parser, **kw) -> float:
        return float((parser.parse_answer(completion) or "").strip() == answer)

    def size(completion, **kw) -> float:
        last = next(m for m in reversed(completion) if m["role"] == "assistant")["content"] or ""
        value = len(last) / 10
        with open(os.environ["SCORED"], "a") as f:
            f.write(json.dumps({"last": last, "size": value}) + "\\n")
        return value

    rubric = vf.Rubric(funcs=[correct, size], weights=[1.0, 0.5], parser=parser)
    common = dict(dataset=Dataset.from_list(rows(n)), eval_dataset=Dataset.from_list(rows(2)),
                  system_prompt=SYSTEM, parser=parser, rubric=rubric)
    if kind == "multi":
        return Retry(max_turns=3, **common, **kwargs)
    if kind == "slow":  # a rollout that may take 0.3 s in all
        return Retry(max_turns=3, timeout_seconds=0.3, **common, **kwargs)
    if kind == "tool":
        def add(a: int, b: int) -> int:
            """Add two integers.

            Args:
                a: The first number.
                b: The second number.
            """
            return a + b
        return vf.ToolEnv(tools=[add], max_turns=3, **common, **kwargs)
    return vf.SingleTurnEnv(**common, **kwargs)


class Retry(vf.MultiTurnEnv):
    """Asks again until the answer is tagged."""

    async def env_response(self, messages, state, **kwargs):
        if re.search(r"<answer>.*</answer>", messages[-1]["content"] or "", re.S):
            state["final_env_response"] = [{"role": "user", "content": "Thanks."}]
            return []
        return [{"role": "user", "content": "Please use the tags."}]
'''


@pytest.fixture
def env_file(tmp_path, monkeypatch):
    path = tmp_path / "vf_env.py"
    path.write_text(ENV)
    monkeypatch.setenv("SCORED", str(tmp_path / "scored.jsonl"))
    return path


def test_the_environments_dataset_loads_as_rows(env_file):
    from swift.dataset.loader import load_rows

    rows = load_rows([f"verifiers:{env_file}?n=3"]).rows
    assert len(rows) == 3
    assert rows[1]["messages"] == [{"role": "system", "content": "Answer inside <answer></answer> tags."},
                                   {"role": "user", "content": "3+4="}]
    assert rows[1]["solution"] == "7" and json.loads(rows[1]["verifiers_input"])["info"] == {"i": 1}
    assert len(load_rows([f"verifiers:{env_file}?n=3:eval"]).rows) == 2
    # a ':' inside the query (a URL) is the argument's, not a split
    assert len(load_rows([f"verifiers:{env_file}?n=3&note=http://h:8000"]).rows) == 3
    with pytest.raises(SwiftError, match="dataset has only 3 rows"):
        load_rows([f"verifiers:{env_file}?n=3#5"])
    with pytest.raises(SwiftError, match="loading the environment failed: TypeError"):
        load_rows([f"verifiers:{env_file}?n=x"])


class Scripted:
    """An engine whose answers are written out: each trajectory's k-th call gets answers[k]."""

    def __init__(self, tokenizer, answers):
        self.tokenizer, self.answers, self.seen = tokenizer, answers, []

    def infer(self, requests, configs):
        from swift.infer.protocol import Choice, InferResponse

        out = []
        for request in requests:
            text = self.tokenizer.decode(request.input_ids)
            turn = text.count("<|im_start|>assistant") - 1
            self.seen.append(text)
            answer = self.answers[min(turn, len(self.answers) - 1)]
            ids = self.tokenizer.encode(answer, add_special_tokens=False)
            out.append(InferResponse([Choice(0, answer, ids, "stop", stop_token_id=self.tokenizer.eos_token_id)],
                                     len(request.input_ids), len(ids) + 1))
        return out


class AsyncOnly(Scripted):
    """An engine with only `infer_async` (as vLLM's): the base class's `infer` runs its own event loop.
    A prompt holding `fail` makes its request raise; `delay` seconds per call."""

    def __init__(self, tokenizer, answers, fail=None, delay=0.0):
        super().__init__(tokenizer, answers)
        self.fail, self.delay = fail, delay

    def infer(self, requests, configs):
        from swift.infer.protocol import InferEngine

        return InferEngine.infer(self, requests, configs)

    async def infer_async(self, request, config):
        import asyncio

        await asyncio.sleep(self.delay)
        if self.fail and self.fail in self.tokenizer.decode(request.input_ids):
            raise RuntimeError("this request failed")
        return Scripted.infer(self, [request], [config])[0]


def rollout(env_file, spec, answers, n=2, max_completion_length=200, engine=None):
    from swift.dataset.loader import load_rows
    from swift.infer.protocol import RequestConfig
    from swift.model import load_model
    from swift.rollout.multi_turn import RolloutInferRequest
    from swift.rollout.verifiers_env import VerifiersRollout
    from swift.template import get_template

    tokenizer = load_model("builtin:tiny-chat")[1]
    template = get_template("chatml", tokenizer)
    engine = (engine or Scripted)(tokenizer, answers)
    rows = load_rows([f"verifiers:{env_file}?{spec}"]).rows
    requests = [RolloutInferRequest(r["messages"], {k: v for k, v in r.items() if k != "messages"}) for r in rows]
    trajectories = VerifiersRollout(engine, template, RequestConfig(max_tokens=64), max_completion_length)(requests, n)
    return tokenizer, engine, trajectories


def masked(tokenizer, t, value):
    return tokenizer.decode([i for i, m in zip(t.completion_ids, t.loss_mask) if m == value])


def test_a_multi_turn_environment_runs_its_own_protocol_and_its_tokens_carry_no_loss(env_file):
    tokenizer, engine, trajectories = rollout(env_file, "n=2&kind=multi", ["I think 5", "<answer>7</answer>"])
    assert len(trajectories) == 4
    for t in trajectories:  # the first answer is untagged, env_response asks again, the second ends it (and its
        # final_env_response closes the conversation, as verifiers renders it)
        assert t.turns == 2 and [m["role"] for m in t.messages] == ["system", "user", "assistant", "user", "assistant",
                                                                     "user"]
        assert t.messages[3]["content"] == "Please use the tags."
        generated, added = masked(tokenizer, t, 1), masked(tokenizer, t, 0)
        assert "I think 5" in generated and "<answer>7</answer>" in generated and "Please use" not in generated
        assert "Please use the tags." in added and "I think" not in added and "answer>" not in added
        assert tokenizer.decode(t.prompt_ids).endswith("<|im_start|>assistant\n")
    # the rubric's weighted total: correct (1.0 × [answer == "3" / "7"]) + size (0.5 × characters / 10)
    assert [t.rollout_infos["verifiers/correct"] for t in trajectories] == [0.0, 0.0, 1.0, 1.0]
    assert [t.rollout_infos["verifiers_reward"] for t in trajectories] == pytest.approx([0.9, 0.9, 1.9, 1.9])


def test_an_engine_with_its_own_event_loop_serves_the_rollouts_and_failures_stay_with_their_trajectory(env_file):
    import functools

    answers = ["I think 5", "<answer>7</answer>"]
    tokenizer, _, trajectories = rollout(env_file, "n=2&kind=multi", answers, engine=AsyncOnly)
    assert [t.turns for t in trajectories] == [2, 2, 2, 2]
    assert [t.rollout_infos["verifiers_reward"] for t in trajectories] == pytest.approx([0.9, 0.9, 1.9, 1.9])
    # the second question's calls fail: its trajectories get no reward and are marked; the first's are whole
    _, _, trajectories = rollout(env_file, "n=2&kind=multi", answers, engine=functools.partial(AsyncOnly, fail="3+4="))
    assert [t.rollout_infos.get("rollout_error") for t in trajectories] == [None, None, "ModelError", "ModelError"]
    assert [t.rollout_infos["verifiers_reward"] for t in trajectories] == pytest.approx([0.9, 0.9, None, None])
    # a rollout past its environment's timeout_seconds ends there (its pending call dropped), the step goes on
    _, _, trajectories = rollout(env_file, "n=1&kind=slow", ["I think 5"], engine=functools.partial(AsyncOnly,
                                                                                                     delay=0.2))
    assert all(t.truncated and t.turns < 3 for t in trajectories)


def test_tool_calls_run_the_environments_tools(env_file):
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 1}}\n</tool_call>'
    tokenizer, engine, trajectories = rollout(env_file, "n=1&kind=tool", [call, "<answer>3</answer>"], n=1)
    (t,) = trajectories
    assert t.rollout_infos["verifiers/correct"] == 1.0
    assert '"name": "add"' in engine.seen[0]  # the tool's schema was rendered into the prompt
    assert [m["role"] for m in t.messages][2:] == ["assistant", "tool", "assistant"]
    assert t.messages[3]["content"] == "3"  # verifiers ran add(2, 1)
    # the tool's result, as the template renders it, is the environment's (no loss); both answers the model's
    assert masked(tokenizer, t, 0) == "\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n" \
                                      "<|im_start|>assistant\n"
    assert masked(tokenizer, t, 1) == call + "<|im_end|><answer>3</answer><|im_end|>"


def test_the_budget_ends_a_trajectory_as_an_overlong_prompt(env_file):
    tokenizer, engine, trajectories = rollout(env_file, "n=1&kind=multi", ["I think 5"], n=1, max_completion_length=8)
    (t,) = trajectories
    assert t.turns == 1 and t.truncated  # no room left for a second call: verifiers' prompt_too_long stop
    assert len(engine.seen) == 1


def test_grpo_trains_on_the_rubrics_reward(tmp_path, env_file):
    rlhf_main(train_argv(tmp_path / "out", "--rlhf_type", "grpo", "--template", "chatml",
                         "--dataset", f"verifiers:{env_file}?n=4", "--num_generations", "2",
                         "--per_device_train_batch_size", "8", "--max_completion_length", "8", "--max_steps", "1",
                         "--reward_funcs", "verifiers", "--log_completions", "true", "--temperature", "1.0"))
    logged = [json.loads(line) for line in open(tmp_path / "out" / "completions.jsonl")]
    assert len(logged) == 8 and len({row["completion"] for row in logged}) > 1
    for row in logged:  # each logged reward is the rubric's total for the logged completion (the untrained
        # model tags no answer: correct is 0 and the total is 0.5 × its size)
        assert row["rewards/verifiers"] == pytest.approx(0.5 * len(row["completion"]) / 10)
    with pytest.raises(SwiftError, match="--reward_funcs verifiers scores rows of --dataset verifiers:<env>"):
        rlhf_main(train_argv(tmp_path / "bad", "--rlhf_type", "grpo", "--dataset", "builtin:arith-sft#8",
                             "--num_generations", "2", "--per_device_train_batch_size", "4", "--max_steps", "1",
                             "--max_completion_length", "8", "--reward_funcs", "verifiers", "--strict", "true"))
    for flag, value, why in (("--max_turns", "2", "--max_turns does nothing without --multi_turn_scheduler"),
                             ("--rollout_mode", "server", "it needs a colocated engine")):
        with pytest.raises(SwiftError, match=why):
            rlhf_main(train_argv(tmp_path / "bad", "--rlhf_type", "grpo", "--dataset", f"verifiers:{env_file}?n=4",
                                 "--num_generations", "2", "--per_device_train_batch_size", "4", "--max_steps", "1",
                                 "--max_completion_length", "8", "--reward_funcs", "verifiers", flag, value))


def test_swift_eval_scores_the_environment_with_its_rubric(tmp_path, env_file):
    from swift.pipelines.eval import eval_main

    report = eval_main(["--model", "builtin:tiny-chat", "--template", "chatml",
                        "--eval_dataset", f"verifiers:{env_file}?n=4&kind=multi", "--max_new_tokens", "12",
                        "--eval_generation_config", '{"n": 2, "temperature": 1.0, "seed": 0}',
                        "--eval_output_dir", str(tmp_path / "eval")])
    (result,) = report["results"].values()
    assert result["num_questions"] == 2 and result["num_samples"] == 2  # the environment's eval dataset
    rows = [json.loads(line) for line in open(os.path.join(report["output_dir"], result["file"]))]
    flat = []
    for row in rows:  # each sample: the rubric's total of its last answer (untagged: 0.5 × size)
        for text, completion, value in zip(row["responses"], row["completions"], row["scores"]):
            assert value == pytest.approx(0.5 * len(text) / 10)
            assert completion[0]["role"] == "assistant"
            flat.append(value)
    assert result["score"] == pytest.approx(sum(flat) / 4) and result["verifiers/correct"] == 0.0
    # without --max_new_tokens each rollout may write 256 tokens after the prompt (not the 1-token default)
    report = eval_main(["--model", "builtin:tiny-chat", "--template", "chatml", "--eval_limit", "1",
                        "--eval_dataset", f"verifiers:{env_file}?n=4", "--eval_output_dir", str(tmp_path / "eval2")])
    (result,) = report["results"].values()
    (row,) = [json.loads(line) for line in open(os.path.join(report["output_dir"], result["file"]))]
    assert len(row["responses"][0]) > 20
    with pytest.raises(SwiftError, match="runs its rollouts with a local model"):
        eval_main(["--eval_url", "http://127.0.0.1:9/v1", "--eval_dataset", f"verifiers:{env_file}"])

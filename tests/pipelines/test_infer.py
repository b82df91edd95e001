"""`swift infer`: batch mode to jsonl, and the interactive chat driven through a pseudo-terminal."""
import json
import os
import sys

import pexpect
import pytest

from swift.infer.transformers_engine import TransformersEngine
from swift.pipelines.infer import infer_main
from swift.utils.registry import SwiftError


def test_batch_mode_writes_rows_and_summary(tmp_path):
    data = tmp_path / "val.jsonl"
    data.write_text("".join(json.dumps({"query": f"{i}+1=", "response": str(i + 1)}) + "\n" for i in range(6)))
    out = tmp_path / "res" / "out.jsonl"
    summary = infer_main(["--model", "builtin:tiny-chat", "--val_dataset", str(data), "--metric", "rouge",
                          "--result_path", str(out), "--max_new_tokens", "4"])
    rows = [json.loads(line) for line in open(out)]
    assert len(rows) == 6 and summary["num_rows"] == 6
    assert rows[0]["reference"] == "1" and rows[0]["messages"] == [{"role": "user", "content": "0+1="}]
    assert all("rouge" in r and "response" in r and "logprobs" not in r for r in rows)
    assert summary["rouge"] == sum(r["rouge"] for r in rows) / 6
    assert json.load(open(tmp_path / "res" / "out_summary.json")) == summary


def val_rows(tmp_path, bad_row=None):
    data = tmp_path / "val.jsonl"
    rows = [{"query": f"{i}+1=", "response": str(i + 1)} for i in range(6)]
    if bad_row is not None:  # a prompt longer than the model's context of 512 tokens
        rows[bad_row - 1] = {"query": "1+1 " * 400, "response": "2"}
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def test_a_bad_row_is_reported_and_skipped_or_stops_the_run_with_strict(tmp_path):
    data = val_rows(tmp_path, bad_row=3)
    out = tmp_path / "out.jsonl"
    argv = ["--model", "builtin:tiny-chat", "--val_dataset", str(data), "--max_new_tokens", "4"]
    summary = infer_main(argv + ["--result_path", str(out)])
    assert summary["num_rows"] == 5 and summary["failed"] == [f"{data} row 3"]
    assert [json.loads(line)["index"] for line in open(out)] == [0, 1, 3, 4, 5]  # dataset order
    with pytest.raises(SwiftError, match=f"{data} row 3: prompt .* exceeds the model's context"):
        infer_main(argv + ["--result_path", str(tmp_path / "strict.jsonl"), "--strict", "true"])


def test_an_interrupted_run_continues_with_the_same_command(tmp_path, monkeypatch):
    data = val_rows(tmp_path)
    out = tmp_path / "out.jsonl"
    argv = ["--model", "builtin:tiny-chat", "--val_dataset", str(data), "--max_new_tokens", "4",
            "--result_path", str(out), "--temperature", "1.0", "--seed", "5"]
    infer_main(argv)
    full = open(out).read().splitlines()
    # the run was killed after two rows, in the middle of writing the third
    out.write_text(full[0] + "\n" + full[1] + "\n" + full[2][:20])
    calls = []
    original = TransformersEngine.infer_async

    async def counted(self, request, config):
        calls.append(request)
        return await original(self, request, config)

    monkeypatch.setattr(TransformersEngine, "infer_async", counted)
    summary = infer_main(argv)
    assert len(calls) == 4 and summary["num_rows"] == 6
    again = open(out).read().splitlines()
    assert again[:2] == full[:2] and [json.loads(line)["index"] for line in again] == list(range(6))
    # a different run never writes over these results
    with pytest.raises(SwiftError, match="already exists with results of another run \\(generation differ"):
        infer_main([*argv[:-2], "--seed", "6"])
    with pytest.raises(SwiftError, match="results of another run \\(engine differ"):  # nor another dtype's
        infer_main([*argv, "--torch_dtype", "bfloat16"])
    with pytest.raises(SwiftError, match="results of another run \\(engine differ"):  # nor another attention's
        infer_main([*argv, "--attn_impl", "eager"])
    assert open(out).read().splitlines() == again


def chat_in_a_terminal(max_new_tokens: int) -> pexpect.spawn:
    return pexpect.spawn(sys.executable, ["-m", "swift", "infer", "--model", "builtin:tiny-chat",
                                          "--max_new_tokens", str(max_new_tokens)], encoding="utf-8", timeout=120,
                         env={**os.environ, "TERM": "dumb"})


def test_interactive_chat_in_a_terminal():
    child = chat_in_a_terminal(5)
    child.expect("<<< ")
    child.sendline("12+34=")
    child.expect(">>> ")
    child.expect("<<< ")
    child.sendline("clear")
    child.expect(r"\(conversation cleared\)")
    child.expect("<<< ")
    child.sendline("reset-system")
    child.expect("new system prompt: ")
    child.sendline("Answer with digits only.")
    child.expect("<<< ")
    child.sendline("multi-line")
    child.expect(r"<<<\[M\] ")
    child.sendline("first line")
    child.sendline("second line#")
    child.expect(">>> ")
    child.expect(r"<<<\[M\] ")
    child.sendline("exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_chat_without_max_new_tokens_and_a_failing_turn_goes_on():
    """ms-swift's default: no --max_new_tokens means the rest of the context (a 512-token model
    used to fail on the first message: 15 prompt tokens + 512); a turn longer than the context
    prints one error line and the chat continues."""
    child = pexpect.spawn(sys.executable, ["-m", "swift", "infer", "--model", "builtin:tiny-chat", "--stream", "false"],
                          encoding="utf-8", timeout=180, env={**os.environ, "TERM": "dumb"})
    child.expect("<<< ")
    child.sendline("12+34=")
    child.expect(">>> ")
    child.expect("<<< ")
    assert "error" not in child.before
    child.sendline("1+1 " * 300)  # about 600 tokens: more than the whole context
    child.expect("error: prompt \\([0-9]+ tokens\\) \\+ max_tokens \\(1\\) exceeds the model's context of 512 tokens")
    child.expect("<<< ")
    child.sendline("7+5=")
    child.expect(">>> ")
    child.expect("<<< ")
    child.sendline("exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_a_row_over_max_length_is_skipped_and_counted(tmp_path):
    """`swift infer --max_length N` (ms-swift's prompt cap): a longer prompt is that row's failure
    under the default delete; with left every row is answered."""
    data = tmp_path / "val.jsonl"
    rows = [{"query": "1+1=", "response": "2"}, {"query": "1+1 " * 30, "response": "2"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--model", "builtin:tiny-chat", "--val_dataset", str(data), "--max_new_tokens", "4", "--max_length", "40"]
    summary = infer_main(argv + ["--result_path", str(tmp_path / "a.jsonl")])
    assert summary["num_rows"] == 1 and summary["failed"] == [f"{data} row 2"]
    summary = infer_main(argv + ["--result_path", str(tmp_path / "b.jsonl"), "--truncation_strategy", "left"])
    assert summary["num_rows"] == 2 and summary["num_failed"] == 0


@pytest.mark.parametrize("command", ["infer", "deploy", "eval", "sample", "app", "rollout"])
def test_the_commands_that_generate_refuse_loss_scale(command):
    from swift.arguments.parser import parse_args
    from swift.cli.main import ARGUMENT_CLASSES, _import

    with pytest.raises(SwiftError, match="^--loss_scale applies to training"):
        parse_args(_import(ARGUMENT_CLASSES[command]), ["--model", "builtin:tiny-chat", "--loss_scale", "all"])


def test_sample_refuses_max_length_where_it_encodes_no_prompt():
    from swift.arguments.parser import parse_args
    from swift.pipelines.sample import SampleArguments

    with pytest.raises(SwiftError, match="^--max_length caps prompts this command encodes; with --sampler_engine client"):
        parse_args(SampleArguments, ["--sampler_engine", "client", "--engine_kwargs", '{"base_url": "http://h:1/v1"}',
                                     "--max_length", "64", "--dataset", "x.jsonl"])


@pytest.mark.parametrize("argv,line", [
    (["--task_type", "seq_cls"], "^--task_type seq_cls: swift infer generates with a causal LM"),
    (["--num_labels", "1"], "^--num_labels: swift infer generates with a causal LM"),
    (["--adapters", "a/lora", "b/lora"], "^--adapters: swift infer applies one adapter to every request, got 2; "
                                         ".*`swift merge-lora --adapters A B`.*`swift deploy --adapters a=A b=B`$"),
    (["--vllm_max_model_len", "256"], "^--vllm_max_model_len is read by the vllm engine only"),
    (["--vllm_enforce_eager", "true"], "^--vllm_enforce_eager is read by the vllm engine only"),
    (["--max_new_tokens", "0"], "^--max_new_tokens must be at least 1, got 0"),
    (["--val_dataset", "v.jsonl", "--stream", "false"], "^--stream false applies to the interactive chat"),
    (["--val_dataset", "v.jsonl", "--top_logprobs", "2"], "^--top_logprobs needs --logprobs true"),
    (["--metric", "acc"], "^--metric applies to batch mode only: give --val_dataset"),
    (["--strict", "true"], "^--strict applies to batch mode only: give --val_dataset"),
    (["--logprobs", "true"], "^--logprobs: the interactive chat does not show log-probs"),
    # before 2026-12-07 accepted (the web console passed it to every infer run, a chat too)
    (["--result_path", "r.jsonl"], "^--result_path applies to batch mode only: give --val_dataset"),
])
def test_infer_refuses_flags_it_would_not_read(argv, line):
    """Before 2026-11-29 each of these was accepted and ignored (--adapters A B applied only B,
    --max_new_tokens 0 generated one token)."""
    from swift.arguments.parser import parse_args
    from swift.pipelines.infer import InferArguments

    with pytest.raises(SwiftError, match=line):
        parse_args(InferArguments, ["--model", "builtin:tiny-chat", *argv])


@pytest.mark.parametrize("argv", [
    ["--val_dataset", "v.jsonl", "--metric", "acc", "--strict", "true", "--logprobs", "true", "--top_logprobs", "2"],
    ["--infer_backend", "vllm", "--vllm_max_model_len", "256"],
    ["--adapters", "a/lora", "--max_new_tokens", "1"],
])
def test_infer_accepts_the_flags_it_reads(argv):
    from swift.arguments.parser import parse_args
    from swift.pipelines.infer import InferArguments

    parse_args(InferArguments, ["--model", "builtin:tiny-chat", *argv])


def test_batch_rows_carry_the_answers_logprobs(tmp_path):
    """--logprobs: each row gets OpenAI's chat `logprobs.content`, one entry per answer token (before
    2026-11-29 the flag was accepted and result rows had none)."""
    out = tmp_path / "out.jsonl"
    infer_main(["--model", "builtin:tiny-chat", "--val_dataset", str(val_rows(tmp_path)), "--max_new_tokens", "3",
                "--result_path", str(out), "--logprobs", "true", "--top_logprobs", "2"])
    rows = [json.loads(line) for line in open(out)]
    assert len(rows) == 6
    for row in rows:
        content = row["logprobs"]["content"]
        assert len(content) == row["usage"]["completion_tokens"] > 0
        for entry in content:
            assert entry["logprob"] <= 0 and bytes(entry["bytes"]).decode() == entry["token"]
            assert len(entry["top_logprobs"]) == 2
            # greedy: the chosen token is the most likely one
            assert entry["top_logprobs"][0]["token"] == entry["token"]
            assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"])
            assert entry["top_logprobs"][1]["logprob"] <= entry["logprob"]


def test_a_row_without_a_conversation_is_that_rows_failure(tmp_path):
    """A `{"text": ...}` row (pretraining data) has nothing to answer: reported, skipped and counted,
    or the one line that stops a --strict run (before 2026-11-29 a KeyError ended the whole run)."""
    data = tmp_path / "val.jsonl"
    rows = [{"query": "1+1=", "response": "2"}, {"text": "once upon a time"}, {"query": "2+2=", "response": "4"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--model", "builtin:tiny-chat", "--val_dataset", str(data), "--max_new_tokens", "2"]
    summary = infer_main(argv + ["--result_path", str(tmp_path / "out.jsonl")])
    assert summary["num_rows"] == 2 and summary["failed"] == [f"{data} row 2"]
    with pytest.raises(SwiftError, match=f"^{data} row 2: no conversation to answer \\(the row has text\\)"):
        infer_main(argv + ["--result_path", str(tmp_path / "strict.jsonl"), "--strict", "true"])
    # a run in which every row failed (as when the engine died) ends non-zero, with its summary written
    only_text = tmp_path / "text.jsonl"
    only_text.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps({"text": "b"}) + "\n")
    argv = ["--model", "builtin:tiny-chat", "--val_dataset", str(only_text), "--max_new_tokens", "2"]
    with pytest.raises(SwiftError, match=f"^--val_dataset: every row this run tried failed \\(2\\); the first, {only_text} row 1: "
                                         "no conversation to answer"):
        infer_main(argv + ["--result_path", str(tmp_path / "none.jsonl")])
    assert json.load(open(tmp_path / "none_summary.json"))["num_failed"] == 2


def test_end_of_input_at_the_new_system_prompt_ends_the_chat():
    """Ctrl-D after `reset-system` ends the chat as at the prompt (before 2026-11-29: an EOFError
    traceback)."""
    child = chat_in_a_terminal(2)
    child.expect("<<< ")
    child.sendline("reset-system")
    child.expect("new system prompt: ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert "Traceback" not in child.before and child.exitstatus == 0

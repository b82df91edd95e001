"""Benchmarks during training (`--eval_use_evalscope --eval_dataset ...`, ms-swift's switch): scored at
every eval step and at the end into logging.jsonl, TensorBoard and a PNG curve; the last score equals
`swift eval` of the saved model; DPO logs them too; misuse stops in one line."""
import json
import os
import subprocess

import pytest

from swift.utils.registry import SwiftError

from tests.conftest import SWIFT

BENCH = ["--eval_use_evalscope", "true", "--eval_dataset", "arith", "--eval_limit", "40",
         "--eval_generation_config", '{"max_tokens": 6}', "--eval_steps", "2"]
COMMON = ["--max_steps", "4", "--per_device_train_batch_size", "8", "--save_strategy", "no", "--add_version", "false",
          "--learning_rate", "1e-3"]


def swift(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SWIFT, *argv], capture_output=True, text=True, timeout=900)


def logged(out) -> list[dict]:
    with open(os.path.join(out, "logging.jsonl")) as f:
        return [r for r in map(json.loads, f) if "test_arith" in r]


def test_sft_scores_benchmarks_while_training(tmp_path, quickstart):
    _, qs = quickstart
    out = tmp_path / "sft"
    proc = swift("sft", "--model", os.path.join(qs, "sft"), "--tuner_type", "full", "--dataset",
                 "builtin:arith-sft#64", *COMMON, *BENCH, "--report_to", "tensorboard", "--output_dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = logged(out)
    assert [r["global_step"] for r in rows] == [2, 4]
    assert os.path.exists(out / "images" / "test_arith.png") and os.listdir(out / "runs")
    final = swift("eval", "--model", str(out), "--eval_dataset", "arith", "--eval_limit", "40",
                  "--eval_generation_config", '{"max_tokens": 6}', "--eval_output_dir", str(tmp_path / "eval"))
    assert final.returncode == 0, final.stderr[-3000:]
    (run,) = os.listdir(tmp_path / "eval")
    with open(tmp_path / "eval" / run / "report.json") as f:
        assert json.load(f)["results"]["arith"]["acc"] == pytest.approx(rows[-1]["test_arith"])


def test_dpo_logs_benchmarks(tmp_path, quickstart):
    """--eval_steps 0.5: HF's fraction of the run's steps."""
    _, qs = quickstart
    proc = swift("rlhf", "--rlhf_type", "dpo", "--model", os.path.join(qs, "sft"), "--dataset",
                 "builtin:arith-dpo#32", *COMMON, *BENCH[:-1], "0.5", "--logging_steps", "2", "--report_to", "none",
                 "--output_dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["global_step"] for r in logged(tmp_path)] == [2, 4]
    assert not any("rewards/margins" in r for r in logged(tmp_path))  # DPO's metrics stay on its loss rows
    with open(tmp_path / "logging.jsonl") as f:
        losses = [r for r in map(json.loads, f) if "loss" in r]
    assert [r["global_step"] for r in losses] == [2, 4] and all("rewards/margins" in r for r in losses)


def test_two_ranks_share_the_questions(tmp_path, quickstart):
    """DDP on 2 ranks: each answers half of 41 questions; the gathered score is the saved model's."""
    from tests.deploy.serving import free_port

    _, qs = quickstart
    out = tmp_path / "sft"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NPROC_PER_NODE": "2", "MASTER_PORT": str(free_port())}
    bench = [*BENCH[:4], "--eval_limit", "41", *BENCH[6:]]
    proc = subprocess.run([*SWIFT, "sft", "--model", os.path.join(qs, "sft"), "--tuner_type",
                           "full", "--dataset", "builtin:arith-sft#64", COMMON[0], "2", *COMMON[2:], *bench,
                           "--report_to", "none", "--output_dir", str(out)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "benchmark arith: 41 questions answered by 2 rank(s) (21, 20)" in proc.stderr
    (row,) = logged(out)
    final = swift("eval", "--model", str(out), "--eval_dataset", "arith", "--eval_limit", "41",
                  "--eval_generation_config", '{"max_tokens": 6}', "--eval_output_dir", str(tmp_path / "eval"))
    assert final.returncode == 0, final.stderr[-3000:]
    (run,) = os.listdir(tmp_path / "eval")
    with open(tmp_path / "eval" / run / "report.json") as f:
        assert json.load(f)["results"]["arith"]["acc"] == pytest.approx(row["test_arith"])


@pytest.mark.parametrize("argv,message", [
    (["--eval_dataset", "arith"], "--eval_dataset names benchmarks scored during training and needs --eval_use_evalscope"),
    (["--eval_use_evalscope", "true"], "--eval_use_evalscope needs --eval_dataset"),
    (["--eval_use_evalscope", "true", "--eval_dataset", "arith", "--deepspeed", "zero3"],
     "--eval_use_evalscope generates with the model on every rank"),
])
def test_misuse_is_one_line(argv, message):
    from swift.arguments import SftArguments
    from swift.arguments.parser import parse_args

    with pytest.raises(SwiftError, match="^" + message):
        parse_args(SftArguments, ["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft", *argv])

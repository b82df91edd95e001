"""Can the built-in tiny model learn a process reward model? Held-out step accuracy of
`swift rlhf --rlhf_type prm` runs against the rate of the majority label, on the built-in two-step
sums and on step tasks made here (docs/grpo.md quotes the table).

    python benchmarks/prm_learnability.py --quickstart output/quickstart [--runs NAME ...] [--out DIR]

Runs (full tuning; AdamW β2 0.98; the last evaluation is reported):
- arith_sft_2ep / arith_sft_long: `builtin:arith-prm` (two-step sums; a step is right when it and
  every step before it are), from the quickstart's sft model: 2 epochs at 1e-3, batch 32; and
  3,000 steps at a constant 3e-3, batch 16, no weight decay.
- reverse: a 4-digit number's digits in reverse order, one step each; half the rows are right, the
  others end at their first wrong digit (its label false), from the base tiny model, 2,500 steps.
- even / first_digit (controls): four random digits as steps, labelled "the digit is even" (decided
  by the step's own token) or "equals the prompt's first digit" (a look back at a fixed place).

Slow (about 1 to 10 minutes per run on 2 cores) and not run by CI.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rows(kind: str, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for n in range(10000 if kind == "reverse" else 4000):
        digits = f"{n:04d}" if kind == "reverse" else f"{rng.randrange(10000):04d}"
        if kind == "reverse":
            steps, labels = list(reversed(digits)), [True] * 4
            if rng.random() >= 0.5:
                k = rng.randrange(4)
                steps = steps[:k] + [str((int(steps[k]) + 1 + rng.randrange(9)) % 10)]
                labels = [True] * k + [False]
        elif kind == "even":
            steps = [str(rng.randrange(10)) for _ in range(4)]
            labels = [int(s) % 2 == 0 for s in steps]
        else:  # first_digit
            steps = [digits[0] if rng.random() < 0.5 else str(rng.randrange(10)) for _ in range(4)]
            labels = [s == digits[0] for s in steps]
        rows.append({"prompt": digits, "completions": steps, "labels": labels})
    return rows


def _split(rows: list[dict], out: str, seed: int = 0) -> tuple[str, str]:
    """About 5% held out, by a fixed draw."""
    rng = random.Random(seed + 1)
    train, held = os.path.join(out, "train.jsonl"), os.path.join(out, "eval.jsonl")
    with open(train, "w") as t, open(held, "w") as e:
        for row in rows:
            (e if rng.random() < 0.05 else t).write(json.dumps(row) + "\n")
    return train, held


RUNS = {  # name: (data, start, flags); each run's last evaluation falls on its last step
    "arith_sft_2ep": ("arith", "sft", ["--learning_rate", "1e-3", "--warmup_ratio", "0.05", "--num_train_epochs",
                                       "2", "--per_device_train_batch_size", "32", "--eval_strategy", "epoch"]),
    "arith_sft_long": ("arith", "sft", ["--learning_rate", "3e-3", "--weight_decay", "0", "--warmup_ratio", "0.02",
                                        "--lr_scheduler_type", "constant_with_warmup", "--max_steps", "3000",
                                        "--per_device_train_batch_size", "16", "--eval_steps", "500"]),
    "reverse": ("reverse", "base", ["--learning_rate", "3e-3", "--warmup_ratio", "0.02", "--lr_scheduler_type",
                                    "constant_with_warmup", "--max_steps", "2500", "--per_device_train_batch_size", "32",
                                    "--eval_steps", "500"]),
    "even": ("even", "base", ["--learning_rate", "2e-3", "--max_steps", "150", "--per_device_train_batch_size", "32",
                              "--eval_steps", "75"]),
    "first_digit": ("first_digit", "base", ["--learning_rate", "2e-3", "--max_steps", "400",
                                            "--per_device_train_batch_size", "32", "--eval_steps", "100"]),
}


def majority_rate(path: str | None, rows: list[dict] | None = None) -> float:
    if rows is None:
        with open(path) as f:
            rows = [json.loads(line) for line in f]
    labels = [bool(x) for r in rows for x in r["labels"]]
    true = sum(labels) / len(labels)
    return max(true, 1 - true)


def run(name: str, quickstart: str, out: str) -> tuple[float, float, int]:
    data, start, flags = RUNS[name]
    out = os.path.join(out, name)
    os.makedirs(out, exist_ok=True)
    if data == "arith":
        from swift.dataset.arith import arith_prm

        train, held, majority = "builtin:arith-prm", "builtin:arith-prm:eval", majority_rate(None, arith_prm("eval"))
    else:
        train, held = _split(_rows(data), out)
        majority = majority_rate(held)
    model = os.path.join(quickstart, "sft") if start == "sft" else "builtin:tiny-chat"
    argv = [sys.executable, "-m", "swift", "rlhf", "--rlhf_type", "prm", "--model", model, "--dataset", train,
            "--val_dataset", held, "--tuner_type", "full", "--adam_beta2", "0.98", "--eval_strategy", "steps", *flags,
            "--save_strategy", "no", "--gradient_checkpointing", "false", "--add_version",
            "false", "--logging_steps", "50", "--report_to", "none", "--disable_tqdm", "true",
            "--output_dir", os.path.join(out, "run")]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "run", "logging.jsonl")) as f:
        evals = [r for r in map(json.loads, f) if "eval_step_accuracy" in r]
    return evals[-1]["eval_step_accuracy"], majority, evals[-1]["global_step"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quickstart", default=os.path.join(ROOT, "output", "quickstart"))
    p.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    p.add_argument("--out", default=os.path.join(ROOT, "output", "prm_learnability"))
    a = p.parse_args()
    print("| run | steps | held-out step accuracy | majority-label rate |\n|---|---:|---:|---:|")
    for name in a.runs:
        accuracy, majority, steps = run(name, a.quickstart, a.out)
        print(f"| {name} | {steps} | {accuracy:.3f} | {majority:.3f} |", flush=True)


if __name__ == "__main__":
    main()

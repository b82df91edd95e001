"""Train tokens/s of `swift sft` against TRL's SFTTrainer: same model, data, batch and steps.

    python benchmarks/sft_throughput.py [--steps 30] [--warmup 3] [--batch 8] [--max_length 512] [--data FILE]

Both train the built-in tiny model (full fine-tuning, loss on assistant tokens only) on the same
conversations, with and without packing, with every `TrainingArguments` field in
`_common.trainer_settings` (gradient checkpointing off, fp32 on CPU, the same optimizer and
schedule, sdpa attention). Packing: swift packs samples first-fit-decreasing into rows of
`max_length` with a block-diagonal mask; TRL's default (`packing_strategy="bfd"`) forces
padding-free batches, which TRL documents as supported only with FlashAttention 2/3 (none on CPU),
so TRL packs with `packing_strategy="wrapped"` (rows of exactly `max_length`; `--trl_packing bfd`
runs TRL's default instead). Tokens are the
non-padding input tokens each collator handed to the model; time runs from the end of the last
warm-up step to the end of the last step, measured by the same callback on both sides.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

from datasets import Dataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks._common import (DTYPE, StepTimer, TokenCounter, add_callback, print_config,  # noqa: E402
                                resolved, trainer_settings)
from swift import SftArguments  # noqa: E402
from swift.dataset.loader import load_rows  # noqa: E402
from swift.model import load_model  # noqa: E402
from swift.pipelines.train import TrainPipeline  # noqa: E402

MODEL = "builtin:tiny-chat"
DEFAULT_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "alpaca_en_demo.json")


def settings(a, packing: bool) -> tuple[dict, dict, dict]:
    shared = trainer_settings(max_steps=a.warmup + a.steps, per_device_train_batch_size=a.batch, learning_rate=1e-4)
    swift = dict(model=MODEL, dataset=[a.data], tuner_type="full", torch_dtype=DTYPE, attn_impl="sdpa",
                 max_length=a.max_length, truncation_strategy="right", loss_scale="default", packing=packing)
    trl = dict(max_length=a.max_length, truncation_mode="keep_start", assistant_only_loss=True, loss_type="nll",
               packing=packing, packing_strategy=a.trl_packing, padding_free=packing and a.trl_packing == "bfd",
               activation_offloading=False, use_liger_kernel=False)
    return shared, swift, trl


class CountingPipeline(TrainPipeline):
    def collator(self, tokenizer, model):
        self.counter = TokenCounter(super().collator(tokenizer, model), tokenizer.pad_token_id)
        return self.counter


def run_swift(shared: dict, own: dict, warmup: int) -> tuple[float, dict]:
    timer = StepTimer(warmup)
    with tempfile.TemporaryDirectory() as out:
        pipeline = CountingPipeline(SftArguments(**shared, **own, output_dir=out))
        add_callback(pipeline, timer)
        pipeline.run()
        return pipeline.counter.timed(timer) / timer.seconds, resolved(pipeline.trainer)


def run_trl(shared: dict, own: dict, data: str, warmup: int, peft_config=None) -> tuple[float, dict]:
    from trl import SFTConfig, SFTTrainer

    model, tokenizer, _ = load_model(MODEL, torch_dtype=DTYPE, attn_impl="sdpa")
    dataset = Dataset.from_list([{"messages": r["messages"]} for r in load_rows([data]).rows])
    timer = StepTimer(warmup)
    with tempfile.TemporaryDirectory() as out:
        trainer = SFTTrainer(model=model, args=SFTConfig(**shared, **own, output_dir=out), train_dataset=dataset,
                             processing_class=tokenizer, callbacks=[timer], peft_config=peft_config)
        counter = trainer.data_collator = TokenCounter(trainer.data_collator, tokenizer.pad_token_id)
        trainer.train()
        return counter.timed(timer) / timer.seconds, resolved(trainer)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before them, on both sides")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max_length", type=int, default=512)
    p.add_argument("--data", default=DEFAULT_DATA if os.path.exists(DEFAULT_DATA) else "builtin:arith-sft")
    p.add_argument("--trl_packing", choices=["wrapped", "bfd"], default="wrapped",
                   help="TRL's packing strategy (bfd: its default, padding-free, meant for FlashAttention)")
    a = p.parse_args()
    rows = []
    for packing in (False, True):
        shared, swift, trl = settings(a, packing)
        ours, swift_resolved = run_swift(shared, swift, a.warmup)
        theirs, trl_resolved = run_trl(shared, trl, a.data, a.warmup)
        rows.append((packing, ours, theirs))
    print(f"\nmodel {MODEL}, data {os.path.basename(a.data)}, batch {a.batch}, {a.warmup} warm-up + {a.steps} timed "
          f"steps, max_length {a.max_length}")
    print("\n| packing | swift tok/s | TRL tok/s | ratio |\n|---|---:|---:|---:|")
    for packing, ours, theirs in rows:
        print(f"| {'yes' if packing else 'no'} | {ours:.0f} | {theirs:.0f} | {ours / theirs:.2f} |")
    shared.pop("max_steps")
    print_config({**shared, "max_steps": f"{a.warmup}+{a.steps}"},
                 {"swift `SftArguments`": {**swift, "packing": "False / True"},
                  "TRL `SFTConfig`": {**trl, "packing": "False / True",
                                      **({"padding_free": "False / True"} if trl["padding_free"] else {})}},
                 ["TRL always computes per-token entropy and top-1 accuracy in its fused LM head (logged as "
                  "`entropy`, `mean_token_accuracy`); SFTConfig has no switch for them. swift computes neither.",
                  "TRL's fused LM head scores only labelled positions on Triton devices (GPU) but every position "
                  "elsewhere (CPU); swift projects only positions that predict a label (`logits_to_keep`).",
                  "packing: swift first-fit-decreasing rows of max_length (samples truncated to max_length first, "
                  "block-diagonal mask, per-sample positions). " + (
                      "TRL `wrapped` concatenates the tokenized conversations and cuts them into rows of exactly "
                      "max_length (samples may span rows and attend to each other within a row), since its "
                      "default BFD packing forces padding-free batches, which TRL supports only with "
                      "FlashAttention." if a.trl_packing == "wrapped" else
                      "TRL `bfd` (its default) flattens each batch into one padding-free row of up to "
                      "batch x max_length tokens; with sdpa, transformers builds a block-diagonal mask over that "
                      "whole row from the position ids (correct, but quadratic in the batch's length)."),
                  f"timing: {a.warmup} untimed warm-up steps, then {a.steps} steps timed by the same "
                  "`TrainerCallback` on both sides (end of the last warm-up step to end of the last step)."],
                 {"swift": swift_resolved, "TRL": trl_resolved})


if __name__ == "__main__":
    main()

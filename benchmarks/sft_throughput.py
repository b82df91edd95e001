"""Train tokens/s of `swift sft` against TRL's SFTTrainer: same model, data, batch and steps.

    python benchmarks/sft_throughput.py [--steps 30] [--batch 8] [--max_length 512] [--data FILE]

Both train the built-in tiny model (full fine-tuning, loss on assistant tokens only) on the same
conversations, with and without packing. Tokens are the non-padding input tokens that each
trainer's collator handed to the model; time is the trainer's own `train_runtime`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
from datasets import Dataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from swift import SftArguments  # noqa: E402
from swift.dataset.loader import load_rows  # noqa: E402
from swift.pipelines.train import TrainPipeline  # noqa: E402
from swift.trainers.trainer import SwiftTrainer  # noqa: E402

DEFAULT_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "alpaca_en_demo.json")


class CountingCollator:
    """Wraps a collator and counts the real (non-pad) input tokens it produces."""

    def __init__(self, collator, pad_id: int):
        self.collator, self.pad_id, self.tokens = collator, pad_id, 0

    def __call__(self, batch):
        out = self.collator(batch)
        self.tokens += int((out["input_ids"] != self.pad_id).sum())
        return out


class CountingTrainer(SwiftTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.data_collator = CountingCollator(self.data_collator, self.processing_class.pad_token_id)


class CountingPipeline(TrainPipeline):
    trainer_cls = CountingTrainer


def run_swift(data: str, steps: int, batch: int, max_length: int, packing: bool) -> float:
    with tempfile.TemporaryDirectory() as out:
        args = SftArguments(model="builtin:tiny-chat", dataset=[data], tuner_type="full", learning_rate=1e-4,
                            max_steps=steps, per_device_train_batch_size=batch, max_length=max_length,
                            truncation_strategy="right", packing=packing, output_dir=out, report_to="none",
                            save_strategy="no", logging_steps=steps, disable_tqdm=True, dataloader_pin_memory=False)
        pipeline = CountingPipeline(args)
        result = pipeline.run()
        return pipeline.trainer.data_collator.tokens / result["metrics"]["train_runtime"]


def run_trl(data: str, steps: int, batch: int, max_length: int, packing: bool) -> float:
    from trl import SFTConfig, SFTTrainer

    from swift.model import load_model

    model, tokenizer, _ = load_model("builtin:tiny-chat")
    rows = load_rows([data]).rows
    dataset = Dataset.from_list([{"messages": r["messages"]} for r in rows])
    with tempfile.TemporaryDirectory() as out:
        config = SFTConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=batch, learning_rate=1e-4,
                           max_length=max_length, packing=packing, assistant_only_loss=True, report_to="none",
                           save_strategy="no", logging_steps=steps, disable_tqdm=True, dataloader_pin_memory=False,
                           lr_scheduler_type="cosine", bf16=torch.cuda.is_available(),
                           use_cpu=not torch.cuda.is_available())
        trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
        counter = CountingCollator(trainer.data_collator, tokenizer.pad_token_id)
        trainer.data_collator = counter
        metrics = trainer.train().metrics
        return counter.tokens / metrics["train_runtime"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max_length", type=int, default=512)
    p.add_argument("--data", default=DEFAULT_DATA if os.path.exists(DEFAULT_DATA) else "builtin:arith-sft")
    a = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for packing in (False, True):
        ours = run_swift(a.data, a.steps, a.batch, a.max_length, packing)
        trl = run_trl(a.data, a.steps, a.batch, a.max_length, packing)
        rows.append((packing, ours, trl))
    print(f"\nmodel builtin:tiny-chat, data {os.path.basename(a.data)}, batch {a.batch}, steps {a.steps}, "
          f"max_length {a.max_length}, torch threads {torch.get_num_threads()}")
    print(f"{'packing':<8} {'swift tok/s':>12} {'TRL tok/s':>10} {'ratio':>6}")
    for packing, ours, trl in rows:
        print(f"{str(packing):<8} {ours:>12.0f} {trl:>10.0f} {ours / trl:>6.2f}")


if __name__ == "__main__":
    main()

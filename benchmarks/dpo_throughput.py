"""Steps/s of `swift rlhf --rlhf_type dpo` against TRL's DPOTrainer on the same config.

    python benchmarks/dpo_throughput.py [--steps 20] [--batch 8] [--data FILE]

Both run full-parameter DPO (sigmoid loss, beta 0.1, a frozen copy of the start as reference) on
the built-in tiny model with the same pairs, batch size and step count; time is each trainer's
own `train_runtime`.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile

import torch
from datasets import Dataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from swift.arguments.rlhf import RLHFArguments  # noqa: E402
from swift.dataset.loader import load_rows  # noqa: E402
from swift.model import load_model  # noqa: E402
from swift.pipelines.rlhf import RLHFPipeline  # noqa: E402

DEFAULT_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "dpo_en_demo.json")


def run_swift(data: str, steps: int, batch: int, max_length: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        args = RLHFArguments(model="builtin:tiny-chat", dataset=[data], tuner_type="full", learning_rate=1e-5,
                             max_steps=steps, per_device_train_batch_size=batch, max_length=max_length,
                             truncation_strategy="left", output_dir=out, report_to="none", save_strategy="no",
                             logging_steps=steps, disable_tqdm=True)
        return steps / RLHFPipeline(args).run()["metrics"]["train_runtime"]


def run_trl(data: str, steps: int, batch: int, max_length: int) -> float:
    from trl import DPOConfig, DPOTrainer

    model, tokenizer, _ = load_model("builtin:tiny-chat")
    rows = load_rows([data]).rows
    dataset = Dataset.from_list([{"prompt": r["messages"][:-1], "chosen": [r["messages"][-1]],
                                  "rejected": [{"role": "assistant", "content": r["rejected_response"]}]}
                                 for r in rows])
    with tempfile.TemporaryDirectory() as out:
        config = DPOConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=batch, learning_rate=1e-5,
                           beta=0.1, loss_type=["sigmoid"], max_length=max_length, truncation_mode="keep_end",
                           report_to="none", save_strategy="no", logging_steps=steps, disable_tqdm=True,
                           use_cpu=not torch.cuda.is_available(), bf16=torch.cuda.is_available(),
                           lr_scheduler_type="cosine")
        trainer = DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=config, train_dataset=dataset,
                             processing_class=tokenizer)
        return steps / trainer.train().metrics["train_runtime"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max_length", type=int, default=512)
    p.add_argument("--data", default=DEFAULT_DATA if os.path.exists(DEFAULT_DATA) else "builtin:arith-dpo")
    a = p.parse_args()
    ours = run_swift(a.data, a.steps, a.batch, a.max_length)
    trl = run_trl(a.data, a.steps, a.batch, a.max_length)
    print(f"\nmodel builtin:tiny-chat, data {os.path.basename(a.data)}, batch {a.batch} pairs, steps {a.steps}, "
          f"max_length {a.max_length}, torch threads {torch.get_num_threads()}")
    print(f"{'trainer':<22} {'steps/s':>8} {'ratio':>6}")
    print(f"{'TRL DPOTrainer':<22} {trl:>8.3f} {1.0:>6.2f}")
    print(f"{'swift rlhf (dpo)':<22} {ours:>8.3f} {ours / trl:>6.2f}")


if __name__ == "__main__":
    main()

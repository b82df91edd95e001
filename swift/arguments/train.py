"""Arguments of `swift pt` and `swift sft`: model + data + template + tuner + HF training arguments."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from transformers import Seq2SeqTrainingArguments

from swift.arguments.base import ComposedArguments
from swift.arguments.data import DataArguments
from swift.arguments.model import ModelArguments
from swift.arguments.template import TemplateArguments
from swift.arguments.tuner import TunerArguments
from swift.utils.registry import SwiftError


@dataclass
class TrainingArguments(Seq2SeqTrainingArguments):
    """HF training arguments with the defaults ms-swift users expect."""

    output_dir: str | None = field(default="output", metadata={"help": "Where checkpoints, logs and the final model go."})
    learning_rate: float | None = field(default=None, metadata={"help": "Peak learning rate (default 1e-4 for LoRA, 1e-5 for full)."})
    warmup_ratio: float = field(default=0.0, metadata={"help": "Fraction of total steps used for linear warmup."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Learning-rate schedule (cosine, linear, constant, ...)."})
    logging_steps: float = field(default=5, metadata={"help": "Log every N optimizer steps."})
    eval_strategy: str | None = field(default=None, metadata={"help": "no | steps | epoch; 'steps' when validation data exists."})
    report_to: None | str | list[str] = field(default_factory=lambda: ["tensorboard"], metadata={
        "help": "Trackers: tensorboard (default), wandb, none, ..."})
    remove_unused_columns: bool = field(default=False, metadata={"help": "Keep our encoded columns (do not change)."})
    use_cpu: bool | None = field(default=None, metadata={"help": "Train on CPU (default: only when no GPU is present)."})
    add_version: bool = field(default=True, metadata={
        "help": "Write this run to <output_dir>/v<N>-<YYYYMMDD-HHMMSS> (N counts earlier runs there), so no earlier "
                "run is overwritten or appended to; false: write to --output_dir itself."})

    def __post_init__(self) -> None:
        if self.deepspeed:  # HF would take it as a file path; nothing here has been run with DeepSpeed
            from swift.arguments.ms_swift import refusal

            raise SwiftError(refusal("deepspeed"))
        if self.use_cpu is None:
            # Accelerate runs multi-process CPU training (gloo) only when told it is on CPU.
            self.use_cpu = not torch.cuda.is_available()
        if self.learning_rate is None:
            self.learning_rate = 1e-4
        if self.eval_strategy is None:
            self.eval_strategy = "no"
        if self.warmup_ratio:
            if not 0 <= self.warmup_ratio < 1:
                raise SwiftError(f"--warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
            self.warmup_steps = self.warmup_ratio
        super().__post_init__()


class SftArguments(ComposedArguments):
    """`swift sft`: supervised fine-tuning on conversations (loss on assistant turns)."""

    parts: ClassVar[dict[str, type]] = {
        "model_args": ModelArguments,
        "data_args": DataArguments,
        "template_args": TemplateArguments,
        "tuner_args": TunerArguments,
        "training_args": TrainingArguments,
    }

    def __init__(self, **kwargs: Any):
        tuner = kwargs.get("train_type") or kwargs.get("tuner_type") or self.defaults.get("tuner_type", "lora")
        if kwargs.get("learning_rate") is None:
            kwargs["learning_rate"] = 1e-4 if tuner == "lora" else 1e-5
        has_val = bool(kwargs.get("val_dataset")) or float(kwargs.get("split_dataset_ratio") or 0) > 0
        if kwargs.get("eval_strategy") is None:  # with validation data, evaluate whenever a checkpoint is saved
            kwargs["eval_strategy"] = ("epoch" if str(kwargs.get("save_strategy")) == "epoch" else "steps") \
                if has_val else "no"
        if kwargs.get("eval_steps") is None:  # ms-swift evaluates whenever it saves
            kwargs["eval_steps"] = kwargs.get("save_steps") or 500
        super().__init__(**kwargs)

    def __post_init__(self) -> None:
        if not self.model:
            raise SwiftError("--model is required (a local directory, a hub id, or builtin:tiny-chat)")
        if not self.dataset:
            raise SwiftError("--dataset is required (a file, a hub id, or builtin:arith-sft)")
        if self.streaming and self.max_steps <= 0:
            raise SwiftError("--streaming needs --max_steps (the length of a stream is unknown)")
        if self.packing and self.attn_impl in ("flash_attn", "flash_attention_2", "flash_attention_3"):
            raise SwiftError("--packing builds a block-diagonal attention mask, which FlashAttention does not take "
                             "(padding-free FlashAttention packing is not implemented yet); use --attn_impl sdpa")
        if self.task_type == "seq_cls" and self.packing:
            raise SwiftError("--packing is for causal_lm; seq_cls samples are scored one per row")


class PtArguments(SftArguments):
    """`swift pt`: pre-training / continued pre-training (loss on every token)."""

    defaults: ClassVar[dict[str, Any]] = {"loss_scale": "all", "tuner_type": "full"}


TrainArguments = SftArguments  # the name older ms-swift releases used

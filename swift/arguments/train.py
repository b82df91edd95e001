"""Arguments of `swift pt` and `swift sft`: model + data + template + tuner + HF training arguments."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from transformers import Seq2SeqTrainingArguments

from swift.arguments.base import ComposedArguments
from swift.arguments.deepspeed import zero3
from swift.arguments.eval import TrainEvalArguments
from swift.arguments.data import DataArguments
from swift.arguments.model import ModelArguments
from swift.arguments.template import TemplateArguments
from swift.arguments.tuner import TunerArguments
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError


# Seq2Seq/Trainer fields nothing here reads (the loss and the generation evaluation are our own)
UNREAD_HF_FLAGS = (
    ("label_smoothing_factor", 0.0, "is not applied: the losses are computed here, not by HF's label smoother"),
    ("sortish_sampler", False, "is Seq2SeqTrainer's sampler; this trainer does not use it"),
    ("generation_num_beams", None, "does nothing: --predict_with_generate decodes greedily (ms-swift's num_beams is "
                                   "refused for the same reason)"),
    ("generation_config", None, "does nothing: --predict_with_generate decodes greedily up to --generation_max_length"),
)


@dataclass
class TrainingArguments(Seq2SeqTrainingArguments):
    """HF training arguments with the defaults ms-swift users expect."""

    output_dir: str | None = field(default="output", metadata={"help": "Where checkpoints, logs and the final model go."})
    learning_rate: float | None = field(default=None, metadata={"help": "Peak learning rate (default 1e-4 for LoRA, 1e-5 for full)."})
    warmup_ratio: float = field(default=0.0, metadata={"help": "Fraction of total steps used for linear warmup."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Learning-rate schedule (cosine, linear, constant, ...)."})
    logging_steps: float = field(default=5, metadata={"help": "Log every N optimizer steps."})
    eval_strategy: str | None = field(default=None, metadata={"help": "no | steps | epoch; 'steps' when validation data exists."})
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"], metadata={
        "help": "Trackers, one or several: tensorboard (default), wandb, none, ..."})
    remove_unused_columns: bool = field(default=False, metadata={"help": "Keep our encoded columns (do not change)."})
    use_cpu: bool | None = field(default=None, metadata={"help": "Train on CPU (default: only when no GPU is present)."})
    gradient_checkpointing: bool = field(default=True, metadata={
        "help": "Recompute activations in the backward pass to save memory (ms-swift's default; non-reentrant). "
                "Turned off, with a log line, for models that do not support it."})
    callbacks: list[str] = field(default_factory=list, metadata={
        "help": "Trainer callbacks by name, registered by an --external_plugins file (swift.plugin.register("
                "'callback', NAME)): a transformers.TrainerCallback subclass, built with the trainer when its "
                "__init__ takes `trainer`, else with no arguments."})
    add_version: bool = field(default=True, metadata={
        "help": "Write this run to <output_dir>/v<N>-<YYYYMMDD-HHMMSS> (N counts earlier runs there), so no earlier "
                "run is overwritten or appended to; false: write to --output_dir itself."})

    def __post_init__(self) -> None:
        from swift.plugin import registry

        for flag, default, why in UNREAD_HF_FLAGS:
            if getattr(self, flag) != default:
                raise SwiftError(f"--{flag} {why}")
        for name in self.callbacks:
            registry("callback").get(name)  # a miss lists the registered names
        # ms-swift's preset names, a JSON file or a dict (HF would take a name as a path). Set up when the
        # run starts (`enable_deepspeed`), so that parsing a command line never starts a process group.
        self.deepspeed_config = None
        if self.deepspeed:
            from swift.arguments.deepspeed import deepspeed_config

            self.deepspeed_config, self.deepspeed = deepspeed_config(self.deepspeed), None
        if self.use_cpu is None:
            # Accelerate runs multi-process CPU training (gloo) only when told it is on CPU.
            self.use_cpu = not torch.cuda.is_available()
        if self.fsdp:
            self._fsdp()
        elif self.fsdp_config:  # HF reads it only with --fsdp (before 2026-12-07 the run trained as DDP silently)
            raise SwiftError("--fsdp_config configures --fsdp, which is not set: give --fsdp fsdp2 (or HF's values)")
        if self.use_liger_kernel:
            import importlib.util

            if self.use_cpu:
                raise SwiftError("--use_liger_kernel: Liger's kernels are Triton GPU kernels; leave it off on CPU")
            if importlib.util.find_spec("liger_kernel") is None:
                raise SwiftError('--use_liger_kernel needs the liger-kernel package: pip install -e ".[liger]"')
        if self.learning_rate is None:
            self.learning_rate = 1e-4
        if self.eval_strategy is None:
            self.eval_strategy = "no"
        if self.gradient_checkpointing and self.gradient_checkpointing_kwargs is None:
            # works with frozen input embeddings (LoRA) without making the inputs require grad
            self.gradient_checkpointing_kwargs = {"use_reentrant": False}
        if self.warmup_ratio:
            # (before 2026-11-29 the ratio won silently, the reverse of HF's precedence)
            if self.warmup_steps and self.warmup_steps != self.warmup_ratio:
                raise SwiftError("--warmup_ratio and --warmup_steps both set the warmup; give one")
            if not 0 <= self.warmup_ratio < 1:
                raise SwiftError(f"--warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
            # HF reads a fraction in warmup_steps as a ratio; args.json keeps the flag as given, so
            # `--config args.json --warmup_steps 3` replays (before 2026-12-07 the copy was saved and
            # that was refused as both set)
            self.saved_values = {"warmup_steps": self.warmup_steps}
            self.warmup_steps = self.warmup_ratio
        super().__post_init__()

    def enable_deepspeed(self) -> None:
        """Hand the DeepSpeed configuration to HF (as its `__post_init__` does) and join the process
        group; called by the pipelines before the model loads (ZeRO-3 partitions it while loading)."""
        if self.deepspeed_config is None or self.deepspeed:
            return
        from accelerate.utils import DeepSpeedPlugin
        from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

        from swift.arguments.deepspeed import init_distributed, single_process_env, skip_cpu_shm_op

        single_process_env()
        if self.use_cpu:
            skip_cpu_shm_op()
        self.__dict__.pop("_setup_devices", None)  # recomputed with DeepSpeed on
        self.deepspeed = self.deepspeed_config
        self.hf_deepspeed_config = HfTrainerDeepSpeedConfig(self.deepspeed)
        self.hf_deepspeed_config.trainer_config_process(self)
        self.deepspeed_plugin = DeepSpeedPlugin(hf_ds_config=self.hf_deepspeed_config)
        self._setup_devices  # noqa: B018  (the process group, now with every rank, before the Trainer looks)
        init_distributed(self)

    def _fsdp(self) -> None:
        """ms-swift's `--fsdp fsdp2` preset (FSDP2, full sharding of each decoder layer), or HF's own
        values; on CPU ranks too (`swift.trainers.fsdp.fsdp_on_cpu`)."""
        value = self.fsdp if isinstance(self.fsdp, str) else " ".join(map(str, self.fsdp))
        if self.deepspeed_config:
            raise SwiftError("--fsdp and --deepspeed both shard the model; give one of them")
        if value == "fsdp2":
            self.fsdp = ["full_shard", "auto_wrap"]
            self.fsdp_config = {"version": 2, "reshard_after_forward": True, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                "cpu_ram_efficient_loading": True, "state_dict_type": "SHARDED_STATE_DICT",
                                **_fsdp_overrides(self.fsdp_config)}


def _fsdp_overrides(config) -> dict:
    """`--fsdp_config` given with the fsdp2 preset: a dict or a JSON file, whose keys win."""
    if isinstance(config, str):
        import json

        try:
            with open(config) as f:
                config = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise SwiftError(f"--fsdp_config {config}: not a readable JSON file ({e})") from None
    return dict(config or {})


class SftArguments(ComposedArguments):
    """`swift sft`: supervised fine-tuning on conversations (loss on assistant turns)."""

    parts: ClassVar[dict[str, type]] = {
        "model_args": ModelArguments,
        "data_args": DataArguments,
        "template_args": TemplateArguments,
        "tuner_args": TunerArguments,
        "training_args": TrainingArguments,
        "bench_args": TrainEvalArguments,
    }

    def __init__(self, **kwargs: Any):
        tuner = kwargs.get("train_type") or kwargs.get("tuner_type") or self.defaults.get("tuner_type", "lora")
        if kwargs.get("learning_rate") is None:
            kwargs["learning_rate"] = 1e-4 if tuner == "lora" else 1e-5
        cached = kwargs.get("cached_dataset") or []
        has_val = bool(kwargs.get("val_dataset")) or float(kwargs.get("split_dataset_ratio") or 0) > 0 or any(
            os.path.isdir(os.path.join(d, "val")) for d in ([cached] if isinstance(cached, str) else cached))
        if kwargs.get("load_best_model_at_end") and not has_val:
            raise SwiftError("--load_best_model_at_end picks a checkpoint by its evaluation; give --val_dataset or "
                             "--split_dataset_ratio")
        if str(kwargs.get("eval_strategy") or "no") != "no" and not has_val:
            # as ms-swift (its own examples pass it with --eval_use_evalscope, which counts its steps
            # itself); HF would stop at a strategy without data
            get_logger(__name__).warning(f"--eval_strategy {kwargs['eval_strategy']}: no validation data "
                                         "(--val_dataset, --split_dataset_ratio), so no eval_loss; set to no")
            kwargs["eval_strategy"] = "no"
        if kwargs.get("eval_strategy") is None:  # with validation data, evaluate whenever a checkpoint is saved
            kwargs["eval_strategy"] = ("epoch" if str(kwargs.get("save_strategy")) == "epoch" else "steps") \
                if has_val else "no"
        if kwargs.get("eval_steps") is None:  # ms-swift evaluates whenever it saves
            kwargs["eval_steps"] = kwargs.get("save_steps") or 500
        super().__init__(**kwargs)

    def builds_a_lora_beside_adapters(self) -> bool:
        """Whether the LoRA flags shape a new adapter even with --adapters (PPO's separate critic)."""
        return False

    def __post_init__(self) -> None:
        if not self.model:
            raise SwiftError("--model is required (a local directory, a hub id, or builtin:tiny-chat)")
        new_lora = self.tuner_args.new_lora_flags()
        if new_lora and self.adapters and not self.builds_a_lora_beside_adapters():
            raise SwiftError(f"--{new_lora[0]} shapes a new LoRA adapter; it does not apply to --adapters (the loaded "
                             "adapter keeps its own configuration)")
        if not self.dataset and not self.cached_dataset:
            raise SwiftError("--dataset is required (a file, a hub id, or builtin:arith-sft)")
        if self.generation_max_length and not self.predict_with_generate:
            raise SwiftError("--generation_max_length caps the answers of --predict_with_generate; it is not set")
        if self.predict_with_generate and not (self.val_dataset or self.split_dataset_ratio > 0 or self.cached_dataset):
            raise SwiftError("--predict_with_generate answers the validation rows; give --val_dataset or "
                             "--split_dataset_ratio")
        if self.streaming and self.dataloader_num_workers > 1:  # each worker would read the whole stream
            raise SwiftError("--streaming reads one stream: with --dataloader_num_workers above 1 every worker would "
                             "yield every row (use 0 or 1)")
        if self.num_labels is not None and self.task_type == "causal_lm":
            raise SwiftError("--num_labels applies to --task_type seq_cls / token_cls")
        if self.cached_dataset and self.training_args.predict_with_generate:
            raise SwiftError("--predict_with_generate prompts the model with raw validation rows; a --cached_dataset "
                             "holds encoded ones only (its eval loss is computed)")
        if self.cached_dataset and self.task_type != "causal_lm":
            raise SwiftError("--cached_dataset holds causal_lm samples (prompt and answer tokens); "
                             f"--task_type {self.task_type} encodes its own")
        if self.streaming and self.max_steps <= 0:
            raise SwiftError("--streaming needs --max_steps (the length of a stream is unknown)")
        if (self.packing or self.padding_free) and self.attn_impl in ("flash_attn", "flash_attention_2",
                                                                      "flash_attention_3"):
            raise SwiftError(f"--{'packing' if self.packing else 'padding_free'} builds a block-diagonal attention mask, which FlashAttention does not take "
                             "(padding-free FlashAttention packing is not implemented yet); use --attn_impl sdpa")
        if self.quant_bits and (self.tuner_type != "lora" and not self.adapters):
            raise SwiftError("--quant_bits trains LoRA adapters on the quantized model (QLoRA); use --tuner_type lora")
        if self.quant_bits and zero3(self.training_args):
            raise SwiftError("--quant_bits with ZeRO-3 is not supported (its weights cannot be partitioned); use zero2")
        if self.eval_use_evalscope and (self.task_type != "causal_lm" or zero3(self.training_args)
                                        or self.training_args.fsdp):
            raise SwiftError("--eval_use_evalscope generates with the model on every rank: it needs a causal_lm "
                             "whose weights are whole on each rank (not ZeRO-3 or FSDP)")
        if self.task_type == "seq_cls" and (self.packing or self.padding_free):
            raise SwiftError("--packing is for causal_lm; seq_cls samples are scored one per row")


class PtArguments(SftArguments):
    """`swift pt`: pre-training / continued pre-training (loss on every token)."""

    defaults: ClassVar[dict[str, Any]] = {"loss_scale": "all", "tuner_type": "full"}


TrainArguments = SftArguments  # the name older ms-swift releases used

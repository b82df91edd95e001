from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from swift.utils.registry import SwiftError

DTYPES = ("auto", "float32", "float16", "bfloat16")
TASK_TYPES = ("causal_lm", "seq_cls", "token_cls")


def check_bnb_values(args) -> None:
    """The values of the `--bnb_4bit_*` flags (loading here, `swift export --quant_method bnb` too)."""
    if args.bnb_4bit_quant_type not in ("nf4", "fp4"):
        raise SwiftError(f"--bnb_4bit_quant_type {args.bnb_4bit_quant_type!r} is not one of nf4, fp4")
    for flag, valid in (("bnb_4bit_compute_dtype", ("float32", "bfloat16", "float16")),
                        ("bnb_4bit_quant_storage", ("float32", "bfloat16", "float16", "uint8"))):
        value = getattr(args, flag)
        if value is not None and value not in valid:
            raise SwiftError(f"--{flag} {value!r} is not one of {', '.join(valid)}")


def set_bnb_flags(args) -> list[str]:
    """The `--bnb_4bit_*` flags set away from their defaults (read only with 4-bit bitsandbytes)."""
    flags = [f for f in ("bnb_4bit_compute_dtype", "bnb_4bit_quant_storage") if getattr(args, f) is not None]
    return flags + [f for f, default in (("bnb_4bit_quant_type", "nf4"), ("bnb_4bit_use_double_quant", True))
                    if getattr(args, f) != default]


@dataclass
class ModelArguments:
    external_plugins: list[str] = field(default_factory=list, metadata={
        "help": "Python files imported first, before any other flag is checked: their top-level code registers "
                "rewards, schedulers, environments, advantage estimators, loss types, templates, datasets or "
                "callbacks with swift.plugin.register (ms-swift plugin files work too). Installed packages' "
                "`swift.plugins` entry points are imported always."})
    model: str | None = field(default=None, metadata={
        "help": "Model: a local HF directory, a hub id (ModelScope; HF hub with --use_hf), or builtin:tiny-chat."})
    model_type: str | None = field(default=None, metadata={"help": "Model family; inferred from config.json when omitted."})
    model_revision: str | None = field(default=None, metadata={"help": "Hub revision (branch, tag or commit)."})
    use_hf: bool = field(default=False, metadata={"help": "Download hub ids from the Hugging Face hub instead of ModelScope."})
    torch_dtype: str = field(default="auto", metadata={
        "help": "Weights dtype: auto (bf16 on GPUs that support it, else fp32), float32, float16, bfloat16."})
    attn_impl: str | None = field(default=None, metadata={"help": "Attention implementation: sdpa, eager, flex_attention, flash_attn / flash_attention_2 (CUDA + flash-attn)."})
    task_type: Literal["causal_lm", "seq_cls", "token_cls"] = field(default="causal_lm", metadata={
        "help": "causal_lm, seq_cls (a value head on the last token) or token_cls (a head on every token)."})
    check_model: bool = field(default=True, metadata={
        "help": "Before loading, read the header of every safetensors file of a local model directory, so a "
                "truncated or corrupt download stops with one line naming the file (ms-swift's default: on)."})
    quant_method: str | None = field(default=None, metadata={
        "help": "Quantized loading: bnb (bitsandbytes; the method --quant_bits implies)."})
    quant_bits: int | None = field(default=None, metadata={
        "help": "4 or 8: load the linear layers quantized with bitsandbytes (QLoRA with --tuner_type lora; "
                "pip install -e \".[qlora]\")."})
    bnb_4bit_compute_dtype: str | None = field(default=None, metadata={
        "help": "4-bit: the dtype of the matmuls (default: the model's --torch_dtype)."})
    bnb_4bit_quant_type: str = field(default="nf4", metadata={"help": "4-bit: nf4 or fp4."})
    bnb_4bit_use_double_quant: bool = field(default=True, metadata={"help": "4-bit: quantize the scales too."})
    bnb_4bit_quant_storage: str | None = field(default=None, metadata={
        "help": "4-bit: the dtype the packed weights are stored in (default uint8)."})
    num_labels: int | None = field(default=None, metadata={
        "help": "Labels of the seq_cls/token_cls head (1 for a reward model, 2 for a process reward model)."})

    def __post_init__(self) -> None:
        from swift.plugin import load_plugins

        load_plugins(self.external_plugins)  # the first part built: every later check sees the plugins' names
        if self.torch_dtype not in DTYPES:
            raise SwiftError(f"--torch_dtype {self.torch_dtype!r} is not one of {', '.join(DTYPES)}")
        if self.task_type not in TASK_TYPES:
            raise SwiftError(f"--task_type {self.task_type!r} is not one of {', '.join(TASK_TYPES)}")
        if self.quant_method not in (None, "bnb"):
            raise SwiftError(f"--quant_method {self.quant_method} is an ms-swift method this version does not support "
                             "(it loads bnb: bitsandbytes 4/8-bit)")
        if self.quant_method == "bnb" and self.quant_bits is None:
            raise SwiftError("--quant_method bnb needs --quant_bits 4 or 8")
        if self.quant_bits not in (None, 4, 8):
            raise SwiftError(f"--quant_bits must be 4 or 8 (bitsandbytes), got {self.quant_bits}")
        check_bnb_values(self)
        unread = set_bnb_flags(self)
        if unread and self.quant_bits != 4:
            raise SwiftError(f"--{unread[0]} is read only with --quant_bits 4 (bitsandbytes 4-bit loading)")
        if self.model_revision is not None and self.model and (self.model.startswith("builtin:")
                                                               or os.path.isdir(self.model)):
            raise SwiftError(f"--model_revision picks a revision of a hub id; --model {self.model} is local")

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from swift.utils.registry import SwiftError

DTYPES = ("auto", "float32", "float16", "bfloat16")
TASK_TYPES = ("causal_lm", "seq_cls", "token_cls")


@dataclass
class ModelArguments:
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
    num_labels: int | None = field(default=None, metadata={
        "help": "Labels of the seq_cls/token_cls head (1 for a reward model, 2 for a process reward model)."})

    def __post_init__(self) -> None:
        if self.torch_dtype not in DTYPES:
            raise SwiftError(f"--torch_dtype {self.torch_dtype!r} is not one of {', '.join(DTYPES)}")
        if self.task_type not in TASK_TYPES:
            raise SwiftError(f"--task_type {self.task_type!r} is not one of {', '.join(TASK_TYPES)}")

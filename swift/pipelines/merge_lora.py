"""`swift merge-lora`: fold LoRA adapters into their base model and save a standalone HF model."""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from safetensors import safe_open

from swift.arguments.base import ComposedArguments
from swift.model import load_model
from swift.model.loader import resolve_model_dir
from swift.pipelines.base import resolve_args
from swift.utils.io import read_json, write_json
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
SAFETENSORS_FLOAT = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


@dataclass
class MergeOptions:
    adapters: list[str] = field(default_factory=list, metadata={"help": "LoRA adapter directories, applied in order."})
    model: str | None = field(default=None, metadata={
        "help": "Base model; read from the adapter's args.json / adapter_config.json when omitted."})
    output_dir: str | None = field(default=None, metadata={"help": "Where the merged model goes (default: <adapter>-merged)."})
    torch_dtype: str = field(default="auto", metadata={
        "help": "dtype of the merged weights (auto: the base checkpoint's dtype, from its config.json or, "
                "without one there, its safetensors; float32 if neither says)."})
    use_hf: bool = field(default=False, metadata={"help": "Download a hub base model from the HF hub instead of ModelScope."})
    safe_serialization: bool = field(default=True, metadata={"help": "Save as safetensors."})

    def __post_init__(self) -> None:
        if isinstance(self.adapters, str):
            self.adapters = [self.adapters]
        if not self.adapters:
            raise SwiftError("--adapters is required: one or more LoRA adapter directories")
        for path in self.adapters:
            if not os.path.isfile(os.path.join(path, "adapter_config.json")):
                raise SwiftError(f"--adapters {path}: no adapter_config.json there (not a LoRA adapter directory)")
        if self.output_dir is None:
            self.output_dir = self.adapters[-1].rstrip("/") + "-merged"


class MergeLoraArguments(ComposedArguments):
    """`swift merge-lora`: merge LoRA adapters into a standalone model."""

    parts: ClassVar[dict[str, type]] = {"options": MergeOptions}


def base_model_of(adapter_dir: str) -> str:
    """The base model an adapter was trained on: args.json (ours) first, then PEFT's record."""
    args_path = os.path.join(adapter_dir, "args.json")
    if os.path.isfile(args_path):
        model = read_json(args_path).get("model")
        if model:
            return model
    base = read_json(os.path.join(adapter_dir, "adapter_config.json")).get("base_model_name_or_path")
    if not base:
        raise SwiftError(f"{adapter_dir}: cannot tell the base model; pass --model")
    return base


PEFT_TASK_TYPES = {"SEQ_CLS": "seq_cls", "TOKEN_CLS": "token_cls"}


def head_of(adapter_dir: str) -> tuple[str, int | None]:
    """(task_type, num_labels) of the model an adapter was trained on, so a reward model's or a PRM's
    value head (saved with the adapter) is merged into a model with that head: args.json (ours)
    first, then PEFT's task_type and the head's shape in the adapter weights."""
    args_path = os.path.join(adapter_dir, "args.json")
    if os.path.isfile(args_path):
        saved = read_json(args_path)
        if saved.get("task_type"):
            return saved["task_type"], saved.get("num_labels")
    peft_task = read_json(os.path.join(adapter_dir, "adapter_config.json")).get("task_type")
    task_type = PEFT_TASK_TYPES.get(str(peft_task), "causal_lm")
    num_labels = None
    weights = os.path.join(adapter_dir, "adapter_model.safetensors")
    if task_type != "causal_lm" and os.path.isfile(weights):
        with safe_open(weights, "pt") as f:
            for key in f.keys():
                if key.endswith(("score.weight", "classifier.weight")):
                    num_labels = f.get_slice(key).get_shape()[0]
                    break
    return task_type, num_labels


def checkpoint_dtype(model: str, *, use_hf: bool = False) -> str:
    """The dtype a base model's checkpoint is stored in: its config's `dtype` (`torch_dtype` in older
    configs), else that of the first floating-point tensor in its safetensors, else float32."""
    model_dir, _ = resolve_model_dir(model, use_hf=use_hf)
    config_path = os.path.join(model_dir, "config.json")
    config = read_json(config_path) if os.path.isfile(config_path) else {}
    for key in ("dtype", "torch_dtype"):
        name = str(config.get(key) or "").removeprefix("torch.")
        if name in FLOAT_DTYPES:
            return name
    for file in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(file, "pt") as f:
            for key in f.keys():
                dtype = f.get_slice(key).get_dtype()
                if dtype in SAFETENSORS_FLOAT:
                    return SAFETENSORS_FLOAT[dtype]
    return "float32"


def merged_model(base: str, adapters: list[str], *, torch_dtype: str = "auto", use_hf: bool = False):
    """(model, tokenizer): `base` with `adapters` folded in, in order, in the base checkpoint's dtype
    for `auto` (load_model's `auto` would give float32 on a CPU)."""
    dtype = checkpoint_dtype(base, use_hf=use_hf) if torch_dtype == "auto" else torch_dtype
    task_type, num_labels = head_of(adapters[0]) if adapters else ("causal_lm", None)
    model, tokenizer, _ = load_model(base, use_hf=use_hf, torch_dtype=dtype, task_type=task_type,
                                     num_labels=num_labels)
    from peft import PeftModel  # imported here: `swift deploy/infer` without adapters start without peft

    for adapter in adapters:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        logger.info(f"merged {adapter}")
    return model, tokenizer


def merge_lora_main(args: MergeLoraArguments | list[str] | None = None) -> dict[str, Any]:
    a = resolve_args(MergeLoraArguments, args, "swift merge-lora")
    base = a.model or base_model_of(a.adapters[0])
    if os.path.abspath(a.output_dir) in {os.path.abspath(p) for p in a.adapters}:
        raise SwiftError("--output_dir must differ from the adapter directory (the adapter would be overwritten)")
    model, tokenizer = merged_model(base, a.adapters, torch_dtype=a.torch_dtype, use_hf=a.use_hf)
    model.config._name_or_path = a.output_dir
    model.save_pretrained(a.output_dir, safe_serialization=a.safe_serialization)
    tokenizer.save_pretrained(a.output_dir)
    write_json(os.path.join(a.output_dir, "merge_args.json"), {**a.to_dict(), "model": base})
    logger.info(f"merged model saved to {a.output_dir}")
    return {"output_dir": a.output_dir, "base_model": base}

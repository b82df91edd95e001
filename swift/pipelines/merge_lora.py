"""`swift merge-lora`: fold LoRA adapters into their base model and save a standalone HF model."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from peft import PeftModel

from swift.arguments.base import ComposedArguments
from swift.model import load_model
from swift.pipelines.base import resolve_args
from swift.utils.io import read_json, write_json
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)


@dataclass
class MergeOptions:
    adapters: list[str] = field(default_factory=list, metadata={"help": "LoRA adapter directories, applied in order."})
    model: str | None = field(default=None, metadata={
        "help": "Base model; read from the adapter's args.json / adapter_config.json when omitted."})
    output_dir: str | None = field(default=None, metadata={"help": "Where the merged model goes (default: <adapter>-merged)."})
    torch_dtype: str = field(default="auto", metadata={"help": "dtype of the merged weights (auto keeps the base's dtype)."})
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


def merge_lora_main(args: MergeLoraArguments | list[str] | None = None) -> dict[str, Any]:
    a = resolve_args(MergeLoraArguments, args, "swift merge-lora")
    base = a.model or base_model_of(a.adapters[0])
    if os.path.abspath(a.output_dir) in {os.path.abspath(p) for p in a.adapters}:
        raise SwiftError("--output_dir must differ from the adapter directory (the adapter would be overwritten)")
    model, tokenizer, _ = load_model(base, use_hf=a.use_hf, torch_dtype=a.torch_dtype)
    for adapter in a.adapters:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        logger.info(f"merged {adapter}")
    model.config._name_or_path = a.output_dir
    model.save_pretrained(a.output_dir, safe_serialization=a.safe_serialization)
    tokenizer.save_pretrained(a.output_dir)
    write_json(os.path.join(a.output_dir, "merge_args.json"), {**a.to_dict(), "model": base})
    logger.info(f"merged model saved to {a.output_dir}")
    return {"output_dir": a.output_dir, "base_model": base}

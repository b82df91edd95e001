"""`swift merge-lora`: fold LoRA adapters into their base model and save a standalone HF model."""
from __future__ import annotations

import glob
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from safetensors import safe_open

from swift.app.runs import not_console_files
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
    output_dir: str | None = field(default=None, metadata={
        "help": "Where the merged model goes: a new or empty directory (default: <adapter>-merged)."})
    torch_dtype: str = field(default="auto", metadata={
        "help": "dtype of the merged weights: auto (the base checkpoint's dtype, from its config.json or, "
                "without one there, its safetensors; float32 if neither says), float32, float16, bfloat16, float64."})
    use_hf: bool = field(default=False, metadata={"help": "Download a hub base model from the HF hub instead of ModelScope."})
    safe_serialization: bool = field(default=True, metadata={
        "help": "Save as safetensors (false is refused: transformers 5 writes safetensors only)."})

    def __post_init__(self) -> None:
        if isinstance(self.adapters, str):
            self.adapters = [self.adapters]
        if not self.adapters:
            raise SwiftError("--adapters is required: one or more LoRA adapter directories")
        if not self.safe_serialization:
            raise SwiftError("--safe_serialization false: transformers 5 writes weights as safetensors only")
        for path in self.adapters:
            if not os.path.isfile(os.path.join(path, "adapter_config.json")):
                raise SwiftError(f"--adapters {path}: no adapter_config.json there (not a LoRA adapter directory)")
        if self.torch_dtype not in ("auto", *FLOAT_DTYPES):
            raise SwiftError(f"--torch_dtype {self.torch_dtype!r} is not one of auto, {', '.join(FLOAT_DTYPES)} "
                             "(a merged model is saved in a float dtype; quantize it with swift export)")
        if self.output_dir is None:
            self.output_dir = self.adapters[-1].rstrip("/") + "-merged"
        if os.path.abspath(self.output_dir) in {os.path.abspath(p) for p in self.adapters}:
            raise SwiftError("--output_dir must differ from the adapter directory (the adapter would be overwritten)")
        check_output_dir(self.output_dir)


def check_output_dir(output_dir: str) -> None:
    """A merge writes only into a new or empty directory (one the web console's run files alone may
    be in): never over an earlier model or the base model's own files."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise SwiftError(f"--output_dir {output_dir} is a file; pass a new or empty directory")
    parent = os.path.dirname(os.path.abspath(output_dir))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise SwiftError(f"--output_dir {output_dir}: {parent} is a file, not a directory")
    present = not_console_files(os.listdir(output_dir) if os.path.isdir(output_dir) else [])
    if present:
        raise SwiftError(f"--output_dir {output_dir} is not empty ({len(present)} entries, e.g. {present[0]}); pass a "
                         "new or empty directory, so no model is overwritten")


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
    from swift.tuners import PeftModel  # imported here: `swift deploy/infer` without adapters start without peft

    for adapter in adapters:
        tied = model.get_input_embeddings().weight if getattr(model.config, "tie_word_embeddings", False) else None
        peft_model = PeftModel.from_pretrained(model, adapter)
        refuse_tied_lora(peft_model, tied, adapter)
        model = peft_model.merge_and_unload()
        logger.info(f"merged {adapter}")
    return model, tokenizer


def refuse_tied_lora(peft_model: Any, tied: Any, adapter: str) -> None:
    """Stop if a LoRA layer of `adapter` sits on the matrix the model ties between its input
    embeddings and its output layer (`tied`). Unmerged, the update applies to one of the two uses;
    merged, it would change the shared matrix, and so both: not the model base + adapter computes."""
    if tied is None:
        return
    from peft.tuners.lora import LoraLayer
    from torch import nn

    for name, module in peft_model.base_model.model.named_modules():
        if isinstance(module, LoraLayer) and module.get_base_layer().weight is tied:
            other = "output layer" if isinstance(module.get_base_layer(), nn.Embedding) else "input embeddings"
            raise SwiftError(f"--adapters {adapter}: LoRA on {name}, whose matrix this model ties to its {other} "
                             "(tie_word_embeddings); merging would change both uses, so the merged model would "
                             "differ from base + adapter. Serve the adapter unmerged (swift deploy/infer --adapters)")


def merge_lora_main(args: MergeLoraArguments | list[str] | None = None) -> dict[str, Any]:
    a = resolve_args(MergeLoraArguments, args, "swift merge-lora")
    base = a.model or base_model_of(a.adapters[0])
    model, tokenizer = merged_model(base, a.adapters, torch_dtype=a.torch_dtype, use_hf=a.use_hf)
    model.config._name_or_path = a.output_dir

    def save(folder: str) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        write_json(os.path.join(folder, "merge_args.json"), {**a.to_dict(), "model": base})

    save_whole(a.output_dir, save)
    logger.info(f"merged model saved to {a.output_dir}")
    return {"output_dir": a.output_dir, "base_model": base}


def save_whole(output_dir: str, save: Callable[[str], None]) -> None:
    """`save` into a staging directory beside `output_dir`, then move its files in: a merge that fails
    while saving leaves nothing half-written there (before 2026-11-29 it wrote straight into it)."""
    check_output_dir(output_dir)  # again: files may have arrived while the model was merged
    staging = os.path.join(os.path.dirname(os.path.abspath(output_dir)),
                           f".{os.path.basename(os.path.abspath(output_dir))}.merging-{os.getpid()}")
    try:
        shutil.rmtree(staging, ignore_errors=True)  # a killed earlier run of the same process id
        os.makedirs(staging)
        save(staging)
        if not os.path.exists(output_dir):
            os.replace(staging, output_dir)
            return
        for name in os.listdir(staging):  # the web console's run directory: its run files stay
            os.replace(os.path.join(staging, name), os.path.join(output_dir, name))
        os.rmdir(staging)
    except OSError as e:
        raise SwiftError(f"--output_dir {output_dir}: {e.strerror or e} (nothing was written there)") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)

"""`swift export`: merge LoRA adapters, write GGUF for llama.cpp (f16, q8_0, q4_k_m) and an Ollama
Modelfile beside it, with ms-swift's flag names.

Everything is written into a staging folder beside `--output_dir` and moved there only when the
whole export succeeded, so a failed, interrupted or terminated export leaves `--output_dir` as it was
(a SIGKILL leaves the hidden `.<name>.partial-*` and `.<name>.scratch-*` folders behind).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

from swift.arguments.base import ComposedArguments
from swift.pipelines.base import resolve_args
from swift.utils.io import read_json, write_json
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)
TEMPLATE_FILES = ("tokenizer_config.json", "chat_template.jinja")
# `{% generation %}` marks the assistant's tokens for training (transformers' return_assistant_tokens_mask);
# it renders nothing, and runtimes' template engines (llama.cpp's, Ollama's import) do not know the tag
GENERATION_TAG = re.compile(r"{%(-?)\s*(end)?generation\s*(-?)%}")
# what a tag becomes: a block that renders its body, with the tag's own whitespace control kept
_GENERATION_BLOCK = {None: "if true", "end": "endif"}
# a checkpoint's weight files: with --exist_ok, those of an earlier export are removed so that no
# stale shard is loaded beside the new ones
WEIGHT_FILE = re.compile(r".*\.(safetensors|bin|gguf)$|.*\.safetensors\.index\.json$|.*\.bin\.index\.json$")
# the order, #N sample and split of a cached dataset's rows by default: training's default --seed
CACHE_SEED = 42
SHARD_SIZE = re.compile(r"^\d+(\.\d+)?\s*([KMGT]i?B|B)?$", re.IGNORECASE)


def _generation_tags_as_blocks(template: str) -> str:
    return GENERATION_TAG.sub(lambda m: f"{{%{m[1]} {_GENERATION_BLOCK[m[2]]} {m[3]}%}}", template)


@dataclass
class ExportOptions:
    model: str | None = field(default=None, metadata={
        "help": "The model to export (a local directory, a hub id or builtin:...); with --adapters, read from the "
                "adapter's args.json / adapter_config.json when omitted."})
    adapters: list[str] = field(default_factory=list, metadata={
        "help": "LoRA adapter directories, folded into the model (in order) before anything is written."})
    output_dir: str | None = field(default=None, metadata={
        "help": "Where the export goes (default: <adapter or model name>-<merged|gguf-TYPE|ollama>)."})
    exist_ok: bool = field(default=False, metadata={
        "help": "Write into an --output_dir that already has files (they are replaced only by files of the same "
                "name, once the export succeeded)."})
    merge_lora: bool = field(default=False, metadata={
        "help": "Write the model with --adapters merged into it, as a standalone HF checkpoint."})
    torch_dtype: str = field(default="auto", metadata={
        "help": "dtype of merged weights (auto: the base checkpoint's dtype)."})
    safe_serialization: bool = field(default=True, metadata={"help": "Save HF weights as safetensors."})
    max_shard_size: str = field(default="5GB", metadata={"help": "Largest HF weight file (e.g. 5GB, 500MB)."})
    use_hf: bool = field(default=False, metadata={"help": "Download a hub model from the HF hub instead of ModelScope."})
    to_gguf: bool = field(default=False, metadata={
        "help": "Write a GGUF file for llama.cpp / Ollama with llama.cpp's converter (the [gguf] extra)."})
    gguf_type: str = field(default="f16", metadata={
        "help": "GGUF weight type, as llama.cpp names it: f16, q8_0 (by the converter) or q4_k_m (by its quantizer)."})
    llama_cpp_dir: str | None = field(default=None, metadata={
        "help": "A llama.cpp checkout whose convert_hf_to_gguf.py to use (default: $LLAMA_CPP_DIR, else the one in "
                "the installed llama-cpp-python's source, fetched once from the package index)."})
    to_ollama: bool = field(default=False, metadata={
        "help": "Write an Ollama Modelfile (FROM the GGUF written beside it, TEMPLATE read off the chat template); "
                "implies --to_gguf."})
    quant_method: str | None = field(default=None, metadata={
        "help": "Quantize the (merged) model into an HF checkpoint that transformers loads: bnb (bitsandbytes; the "
                "[qlora] extra) or gptq (gptqmodel, calibrated on --dataset; requirements/gptq.txt)."})
    quant_bits: int | None = field(default=None, metadata={"help": "bnb: 4 or 8; gptq: 2, 3, 4 or 8."})
    bnb_4bit_quant_type: str = field(default="nf4", metadata={"help": "bnb 4-bit: nf4 or fp4."})
    bnb_4bit_use_double_quant: bool = field(default=True, metadata={"help": "bnb 4-bit: quantize the scales too."})
    bnb_4bit_compute_dtype: str | None = field(default=None, metadata={
        "help": "bnb 4-bit: dtype of the matmuls, saved in the checkpoint's config (default: --torch_dtype)."})
    bnb_4bit_quant_storage: str | None = field(default=None, metadata={
        "help": "bnb 4-bit: dtype the packed weights are stored in (default uint8)."})
    push_to_hub: bool = field(default=False, metadata={
        "help": "Upload the export (or, with nothing else to do, the --adapters / --model folder as it is) to "
                "--hub_model_id on ModelScope, or on the HF hub with --use_hf true."})
    hub_model_id: str | None = field(default=None, metadata={"help": "The repo to upload to (owner/name)."})
    hub_token: str | None = field(default=None, metadata={
        "help": "The hub's access token (default: the hub client's own login / environment)."})
    hub_private_repo: bool = field(default=False, metadata={"help": "Create the repo private when it is missing."})
    commit_message: str = field(default="update files", metadata={"help": "The upload's commit message."})
    dataset: list[str] = field(default_factory=list, metadata={
        "help": "--to_cached_dataset: the rows to encode; GPTQ: calibration rows (default builtin:arith-sft), encoded "
                "by the model's chat template."})
    quant_n_samples: int | None = field(default=None, metadata={"help": "GPTQ: calibration rows used (default 256)."})
    quant_batch_size: int | None = field(default=None, metadata={
        "help": "GPTQ: calibration rows run through the model at once (default 1)."})
    group_size: int | None = field(default=None, metadata={
        "help": "GPTQ: input columns that share one scale (default 128; -1: one per output row)."})
    max_length: int | None = field(default=None, metadata={
        "help": "GPTQ: calibration rows are cut to this many tokens; --to_cached_dataset: as training's (default 2048)."})
    to_peft_format: bool = field(default=False, metadata={
        "help": "Refused: adapters written by this version are in PEFT's format already."})
    to_cached_dataset: bool = field(default=False, metadata={
        "help": "Encode --dataset as `swift sft` would and save it (Arrow) for `swift sft|pt --cached_dataset`."})
    val_dataset: list[str] = field(default_factory=list, metadata={"help": "--to_cached_dataset: validation rows."})
    split_dataset_ratio: float | None = field(default=None, metadata={
        "help": "--to_cached_dataset: fraction of --dataset held out as the cache's val rows (default 0)."})
    dataset_num_proc: int | None = field(default=None, metadata={
        "help": "--to_cached_dataset: processes that encode the rows (default 1; the result is the same)."})
    columns: str | None = field(default=None, metadata={
        "help": "--to_cached_dataset: as training's (a JSON mapping of column renames)."})
    model_name: list[str] = field(default_factory=list, metadata={
        "help": "--to_cached_dataset: fills {{NAME}} in the rows, as training's."})
    model_author: list[str] = field(default_factory=list, metadata={
        "help": "--to_cached_dataset: fills {{AUTHOR}} in the rows, as training's."})
    strict: bool = field(default=False, metadata={
        "help": "--to_cached_dataset: a row that cannot be encoded stops the export (default: dropped and counted)."})
    seed: int | None = field(default=None, metadata={
        "help": "--to_cached_dataset: the data seed (#N sampling, shuffle, split) of the runs that will train on it "
                "(default 42, training's)."})
    template: str | None = field(default=None, metadata={
        "help": "--to_cached_dataset: as training's --template (default: the model's chat template)."})
    system: str | None = field(default=None, metadata={"help": "--to_cached_dataset: as training's --system."})
    truncation_strategy: str | None = field(default=None, metadata={
        "help": "--to_cached_dataset: as training's (delete, left, right; default delete)."})
    loss_scale: str | None = field(default=None, metadata={
        "help": "--to_cached_dataset: as training's (default; `swift pt` trains with all)."})
    to_mcore: bool = field(default=False, metadata={"help": "Refused: this project has no Megatron backend."})
    to_hf: bool = field(default=False, metadata={"help": "Refused: this project has no Megatron backend."})

    def __post_init__(self) -> None:
        if isinstance(self.adapters, str):
            self.adapters = [self.adapters]
        if self.to_ollama:
            self.to_gguf = True
        self._refuse_unbuilt()
        if self.to_cached_dataset:
            self._check_cached_dataset()
        else:
            unread = [f for f in ("val_dataset", "split_dataset_ratio", "dataset_num_proc", "columns", "model_name",
                                  "model_author", "template", "system", "truncation_strategy", "loss_scale", "seed")
                      if getattr(self, f) not in (None, [])] + (["strict"] if self.strict else [])
            if unread:
                raise SwiftError(f"--{unread[0]} is read only with --to_cached_dataset true")
        self._check_values()
        self._check_quant()
        self._check_hub_flags()
        if not (self.merge_lora or self.to_gguf or self.quant_method or self.push_to_hub or self.to_cached_dataset):
            raise SwiftError("nothing to export: pass --merge_lora true, --quant_method bnb|gptq, --to_gguf true, "
                             "--to_ollama true, --to_cached_dataset true or --push_to_hub true")
        if self.uploads_as_is:
            self._check_upload_as_is()
        else:
            self._check_paths()

    @property
    def uploads_as_is(self) -> bool:
        """--push_to_hub with nothing to write: a folder is uploaded as it is."""
        return self.push_to_hub and not (self.merge_lora or self.to_gguf or self.quant_method)

    def _refuse_unbuilt(self) -> None:
        """ms-swift's export paths this version does not build, and the flags only they read."""
        if self.to_peft_format:
            raise SwiftError("--to_peft_format: adapters written by this version are in PEFT's format already")
        for flag in ("to_mcore", "to_hf"):
            if getattr(self, flag):
                raise SwiftError(f"--{flag}: Megatron-Core checkpoints are not made here (this project trains with "
                                 "HF models, DeepSpeed and FSDP only, so there is nothing to convert to or from)")

    def _check_cached_dataset(self) -> None:
        """--to_cached_dataset: rows encoded with the model's tokenizer; no model is written."""
        from swift.arguments.template import TemplateArguments

        others = [f for f in ("merge_lora", "to_gguf", "quant_method", "push_to_hub") if getattr(self, f)]
        if others or self.adapters:
            raise SwiftError(f"--to_cached_dataset writes a dataset, not a model: leave out --{(others or ['adapters'])[0]} "
                             "(export the model in another run)")
        if not self.model:
            raise SwiftError("--to_cached_dataset needs --model (its tokenizer and chat template encode the rows)")
        if not self.dataset:
            raise SwiftError("--to_cached_dataset needs --dataset (the rows to encode)")
        # training's template flags, checked by training's own class, with its defaults
        template = TemplateArguments(**{f: getattr(self, f) for f in ("template", "system", "max_length",
                                                                      "truncation_strategy", "loss_scale")
                                        if getattr(self, f) is not None})
        for f in ("max_length", "truncation_strategy", "loss_scale"):
            setattr(self, f, getattr(template, f))
        self.seed = CACHE_SEED if self.seed is None else self.seed
        self.split_dataset_ratio = self.split_dataset_ratio or 0.0
        self.dataset_num_proc = self.dataset_num_proc or 1
        self.data_args()  # training's own checks of the row flags
        if self.val_dataset and self.split_dataset_ratio:
            raise SwiftError("--split_dataset_ratio holds rows of --dataset out; with --val_dataset it is not read")

    def data_args(self):
        """--to_cached_dataset's row flags as training takes them."""
        from swift.arguments.data import DataArguments

        return DataArguments(dataset=self.dataset, val_dataset=self.val_dataset,
                             split_dataset_ratio=self.split_dataset_ratio, dataset_num_proc=self.dataset_num_proc,
                             columns=self.columns, strict=self.strict, model_name=self.model_name,
                             model_author=self.model_author)

    def _check_values(self) -> None:
        """Each value is valid, and each flag is one this export reads."""
        from swift.arguments.model import DTYPES
        from swift.export.gguf import GGUF_TYPES

        if self.gguf_type not in GGUF_TYPES:
            raise SwiftError(f"--gguf_type {self.gguf_type!r} is not one of {', '.join(GGUF_TYPES)}")
        if self.torch_dtype not in DTYPES:
            raise SwiftError(f"--torch_dtype {self.torch_dtype!r} is not one of {', '.join(DTYPES)}")
        if not SHARD_SIZE.match(str(self.max_shard_size)):
            raise SwiftError(f"--max_shard_size {self.max_shard_size!r} is not a size such as 5GB or 500MB")
        if not (self.merge_lora or self.quant_method):  # no HF checkpoint is written
            unread = [f for f, default in (("torch_dtype", "auto"), ("safe_serialization", True),
                                           ("max_shard_size", "5GB")) if getattr(self, f) != default]
            if unread:
                raise SwiftError(f"--{unread[0]} shapes the HF checkpoint that --merge_lora or --quant_method writes; "
                                 "it is not read here")
        if not self.to_gguf and (self.gguf_type != "f16" or self.llama_cpp_dir):
            raise SwiftError(f"--{'gguf_type' if self.gguf_type != 'f16' else 'llama_cpp_dir'} is read only with "
                             "--to_gguf true or --to_ollama true")

    def _check_hub_flags(self) -> None:
        if self.push_to_hub and not self.hub_model_id:
            raise SwiftError("--push_to_hub needs --hub_model_id (owner/name of the repo to upload to)")
        if not self.push_to_hub:
            unread = [f for f in ("hub_model_id", "hub_token") if getattr(self, f)]
            unread += ["hub_private_repo"] if self.hub_private_repo else []
            unread += ["commit_message"] if self.commit_message != "update files" else []
            if unread:
                raise SwiftError(f"--{unread[0]} is read only with --push_to_hub true")

    def _check_upload_as_is(self) -> None:
        """--push_to_hub alone: one local folder, uploaded as it is."""
        if self.adapters and self.model or len(self.adapters) > 1:
            raise SwiftError("--push_to_hub alone uploads one folder: one of --adapters or --model")
        if self.output_dir is not None:
            raise SwiftError("--output_dir is not read when --push_to_hub uploads a folder as it is")
        source = self.adapters[0] if self.adapters else self.model
        if not os.path.isdir(source):
            raise SwiftError(f"--push_to_hub uploads a local folder; {source} is not one")
        if self.exist_ok:
            raise SwiftError("--exist_ok is not read when --push_to_hub uploads a folder as it is")

    def _check_paths(self) -> None:
        """The inputs exist; --output_dir (defaulted as ms-swift names it) is free and no input."""
        reads_data = self.to_cached_dataset or self.quant_method == "gptq"  # --use_hf picks the datasets' hub too
        if self.use_hf and not self.push_to_hub and not reads_data and self.model and (
                os.path.isdir(self.model) or self.model.startswith("builtin:")):
            raise SwiftError("--use_hf picks the hub of a hub id or of --push_to_hub; --model here is local")
        if self.merge_lora and not self.adapters:
            raise SwiftError("--merge_lora needs --adapters (the LoRA adapters to merge)")
        for path in self.adapters:
            if not os.path.isfile(os.path.join(path, "adapter_config.json")):
                raise SwiftError(f"--adapters {path}: no adapter_config.json there (not a LoRA adapter directory)")
        if not self.model and not self.adapters:
            raise SwiftError("--model is required (or --adapters, whose base model is read from them)")
        if self.output_dir is None:
            source = (self.adapters[-1] if self.adapters else self.model).rstrip("/")
            suffix = ("cached_dataset" if self.to_cached_dataset else "ollama" if self.to_ollama
                      else f"gguf-{self.gguf_type}" if self.to_gguf
                      else f"{self.quant_method}-int{self.quant_bits}" if self.quant_method else "merged")
            self.output_dir = os.path.basename(source.replace("builtin:", "")) + f"-{suffix}" \
                if not self.adapters else f"{source}-{suffix}"
        if os.path.isdir(self.output_dir) and os.listdir(self.output_dir) and not self.exist_ok:
            raise SwiftError(f"--output_dir {self.output_dir} already has files; pass --exist_ok true to write into it")
        if os.path.exists(self.output_dir) and not os.path.isdir(self.output_dir):
            raise SwiftError(f"--output_dir {self.output_dir} is a file")
        out = os.path.realpath(self.output_dir)
        for source in [*self.adapters, *([self.model] if self.model and os.path.isdir(self.model) else [])]:
            real = os.path.realpath(source)
            if os.path.commonpath([out, real]) in (out, real):
                raise SwiftError(f"--output_dir {self.output_dir} overlaps the input {source} (it would be overwritten)")

    def _check_quant(self) -> None:
        if self.quant_method in ("awq", "fp8", "gptq_v2"):
            raise SwiftError(f"--quant_method {self.quant_method} is not built yet: this version exports bnb and gptq "
                             "HF checkpoints and GGUF (--to_gguf --gguf_type q8_0|q4_k_m)")
        if self.quant_method not in (None, "bnb", "gptq"):
            raise SwiftError(f"--quant_method {self.quant_method!r} is not one of bnb, gptq, awq, fp8")
        calibration = [f for f in ("quant_n_samples", "quant_batch_size", "group_size")
                       if getattr(self, f) is not None]
        if not self.to_cached_dataset:  # which reads these two as well
            calibration += [f for f in ("max_length", "dataset") if getattr(self, f) not in (None, [])]
        if calibration and self.quant_method != "gptq":
            raise SwiftError(f"--{calibration[0]} is GPTQ calibration, read only with --quant_method gptq")
        set_bnb = [f for f in ("bnb_4bit_compute_dtype", "bnb_4bit_quant_storage") if getattr(self, f) is not None]
        set_bnb += [f for f, default in (("bnb_4bit_quant_type", "nf4"), ("bnb_4bit_use_double_quant", True))
                    if getattr(self, f) != default]
        if set_bnb and self.quant_method != "bnb":
            raise SwiftError(f"--{set_bnb[0]} is read only with --quant_method bnb")
        if self.quant_method is None:
            if self.quant_bits is not None:
                raise SwiftError("--quant_bits is read only with --quant_method bnb or gptq")
            return
        if self.to_gguf:
            raise SwiftError("--quant_method makes an HF checkpoint; a GGUF is quantized by --gguf_type q8_0|q4_k_m")
        if self.merge_lora:
            raise SwiftError("--merge_lora with --quant_method: the adapters are merged before quantizing anyway, and "
                             "the output folder holds the quantized checkpoint; leave --merge_lora out")
        if self.quant_method == "gptq":
            self._check_gptq()
            return
        if self.quant_bits not in (4, 8):
            raise SwiftError(f"--quant_method bnb needs --quant_bits 4 or 8, got {self.quant_bits}")
        if self.quant_bits == 8 and set_bnb:
            raise SwiftError("--bnb_4bit_* flags are read only with --quant_bits 4")
        from swift.arguments.model import check_bnb_values

        check_bnb_values(self)
        import importlib.util

        if importlib.util.find_spec("bitsandbytes") is None:
            raise SwiftError('--quant_method bnb needs bitsandbytes (the [qlora] extra): pip install -e ".[qlora]"')

    def _check_gptq(self) -> None:
        from swift.export.gptq import DEFAULT_DATASET, GPTQ_BITS, check_installed

        if self.quant_bits not in GPTQ_BITS:
            raise SwiftError(f"--quant_method gptq needs --quant_bits {', '.join(map(str, GPTQ_BITS))}, "
                             f"got {self.quant_bits}")
        self.dataset = self.dataset or [DEFAULT_DATASET]
        for flag, default in (("quant_n_samples", 256), ("quant_batch_size", 1), ("max_length", 2048)):
            value = getattr(self, flag)
            if value is not None and value < 1:
                raise SwiftError(f"--{flag} must be at least 1, got {value}")
            setattr(self, flag, default if value is None else value)
        if not self.safe_serialization:
            raise SwiftError("--safe_serialization false: gptqmodel writes GPTQ checkpoints as safetensors only")
        if self.torch_dtype != "auto":
            raise SwiftError("--torch_dtype is not read by --quant_method gptq: gptqmodel picks the dtype of the "
                             "layers it does not quantize")
        if self.group_size is None:
            self.group_size = 128
        if self.group_size != -1 and self.group_size < 1:
            raise SwiftError(f"--group_size must be -1 (one group per row) or at least 1, got {self.group_size}")
        check_installed()


class ExportArguments(ComposedArguments):
    """`swift export`: merged and converted models for other runtimes."""

    parts: ClassVar[dict[str, type]] = {"options": ExportOptions}


def _without_generation_tags(folder: str) -> None:
    for name in TEMPLATE_FILES:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if name.endswith(".json"):
            config = read_json(path)
            if isinstance(config.get("chat_template"), str):
                config["chat_template"] = _generation_tags_as_blocks(config["chat_template"])
                write_json(path, config)
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            with open(path, "w", encoding="utf-8") as f:
                f.write(_generation_tags_as_blocks(text))


def _has_weights(folder: str) -> bool:
    return any(n.endswith((".safetensors", ".bin")) and not n.startswith("training_args") for n in os.listdir(folder))


def _hf_source(a, staging: str, scratch: str) -> str:
    """An HF checkpoint folder of the model to export, adapters merged: `<staging>` itself with
    --merge_lora (it is part of the export), a folder in `scratch` when it had to be written, else
    the model's own folder."""
    from swift.model.loader import resolve_model_dir
    from swift.pipelines.merge_lora import base_model_of, merged_model

    base = a.model or base_model_of(a.adapters[0])
    model_dir, builtin = resolve_model_dir(base, use_hf=a.use_hf)
    config = os.path.join(model_dir, "config.json")
    if os.path.isfile(config) and read_json(config).get("quantization_config"):
        raise SwiftError(f"--model {base} is a quantized checkpoint already; export from the unquantized model")
    if not (a.adapters or builtin or not _has_weights(model_dir)):
        return model_dir
    target = staging if a.merge_lora else os.path.join(scratch, "hf")
    model, tokenizer = merged_model(base, a.adapters, torch_dtype=a.torch_dtype, use_hf=a.use_hf)
    model.config._name_or_path = a.output_dir
    model.save_pretrained(target, safe_serialization=a.safe_serialization, max_shard_size=a.max_shard_size)
    tokenizer.save_pretrained(target)
    if a.merge_lora:
        write_json(os.path.join(target, "export_args.json"), {**a.to_dict(), "model": base})
    return target


def _runtime_view(hf_dir: str, scratch: str) -> str:
    """`hf_dir` as runtimes read it: its files linked, but the chat template without the training-only
    `{% generation %}` tags (the HF checkpoints written keep them: training on them needs the tags)."""
    view = os.path.join(scratch, "runtime")
    os.makedirs(view)
    for name in os.listdir(hf_dir):
        src = os.path.join(hf_dir, name)
        if os.path.isfile(src):
            if name in TEMPLATE_FILES:
                shutil.copyfile(src, os.path.join(view, name))
            else:
                os.symlink(os.path.abspath(src), os.path.join(view, name))
    _without_generation_tags(view)
    return view


def _check_gguf_tokenizer(gguf_path: str, hf_dir: str) -> dict[str, str]:
    """The GGUF's tokenizer (run by llama.cpp) splits text as the model's own does; a pre-tokenizer that
    llama.cpp names differently would otherwise give a file that loads and answers wrongly."""
    import llama_cpp
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    llm = llama_cpp.Llama(model_path=gguf_path, vocab_only=True, verbose=False)
    samples = ["What is 46 + 18? Answer: 64.", "  two  spaces\tand a tab\n\nnew lines 3.14 1,000,000",
               "I've been told he's there; 'RE you sure?", "naïve café — 東京 🦙"]
    if tokenizer.chat_template:
        samples.append(tokenizer.apply_chat_template([{"role": "user", "content": "12+7=?"}], tokenize=False,
                                                     add_generation_prompt=True))
    for text in samples:
        ours = tokenizer.encode(text, add_special_tokens=False)
        theirs = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        if ours != theirs:
            raise SwiftError(f"--to_gguf: llama.cpp splits {text!r} into other tokens than the model's tokenizer does "
                             "(a tokenizer llama.cpp's converter does not support)")
    return dict(llm.metadata)


def _quantize_bnb(a, hf_dir: str, staging: str) -> None:
    """A bitsandbytes checkpoint: the model loaded with `BitsAndBytesConfig` (its linear layers quantized
    as they load), saved with its quantization config, so transformers loads it quantized again."""
    from swift.model import load_model
    from swift.model.loader import bnb_config

    from swift.pipelines.merge_lora import checkpoint_dtype

    # the unquantized layers (embeddings, norms) keep the checkpoint's dtype, as --torch_dtype auto means here
    dtype = checkpoint_dtype(hf_dir) if a.torch_dtype == "auto" else a.torch_dtype
    flags = {f: getattr(a, f) for f in ("quant_bits", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
                                         "bnb_4bit_compute_dtype", "bnb_4bit_quant_storage")}
    model, tokenizer, _ = load_model(hf_dir, torch_dtype=dtype,
                                     quantization=bnb_config(SimpleNamespace(**flags, torch_dtype=dtype)))
    model.config._name_or_path = a.output_dir
    model.save_pretrained(staging, safe_serialization=a.safe_serialization, max_shard_size=a.max_shard_size)
    tokenizer.save_pretrained(staging)


def _cache_dataset(a, staging: str) -> dict[str, Any]:
    """--to_cached_dataset: --dataset read, split and encoded as `swift sft` does (the same functions,
    training's default seed), saved with the encoding it was made with."""
    from transformers import AutoConfig

    from swift.dataset.cache import encoding_of, write_cache
    from swift.dataset.encode import encode_rows
    from swift.model.loader import load_tokenizer, resolve_model_dir
    from swift.pipelines.train import read_rows
    from swift.template import choose_template, get_template

    model_dir, _ = resolve_model_dir(a.model, use_hf=a.use_hf)
    tokenizer = load_tokenizer(model_dir)
    name = choose_template(a.template, None, AutoConfig.from_pretrained(model_dir).model_type, tokenizer)
    template = get_template(name, tokenizer, system=a.system, max_length=a.max_length,
                            truncation_strategy=a.truncation_strategy, loss_scale=a.loss_scale)
    data = a.options.data_args()
    train_rows, val_rows = read_rows(data, a.seed, a.use_hf)
    train = encode_rows(train_rows, template, strict=data.strict, desc="encode train", num_proc=a.dataset_num_proc)
    train_rows.report("train dataset")
    if not train:
        raise SwiftError(f"--dataset {' '.join(a.dataset)}: no row could be encoded; see the dropped-row report above")
    val = encode_rows(val_rows, template, strict=data.strict, desc="encode val", num_proc=a.dataset_num_proc) \
        if len(val_rows) else []
    if len(val_rows):
        val_rows.report("val dataset")
    write_cache(staging, train, val, encoding_of(template),
                {"model": a.model, "dataset": a.dataset, "val_dataset": a.val_dataset,
                 "split_dataset_ratio": a.split_dataset_ratio, "seed": a.seed})
    logger.info(f"encoded {len(train)} train and {len(val)} val rows with template {name}")
    return {"cached_dataset": a.output_dir, "train_rows": len(train), "val_rows": len(val)}


def _publish(staging: str, output_dir: str, replaces: tuple[str, ...] = ()) -> list[str]:
    """Move the staged export into `output_dir`; returns the names written. Into an existing folder
    (--exist_ok), the weight files of an earlier export go first, so no stale shard is loaded beside
    the new ones; other files stay unless the export has one of the same name."""
    written = sorted(os.listdir(staging))
    if not os.path.isdir(output_dir):
        os.makedirs(os.path.dirname(os.path.abspath(output_dir)), exist_ok=True)
        os.rename(staging, output_dir)
        return written
    for name in os.listdir(output_dir):
        path = os.path.join(output_dir, name)
        if name in replaces and name not in written:  # an earlier export's part this one does not have
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
        elif WEIGHT_FILE.match(name) and os.path.isfile(path) and name not in written:
            os.remove(path)
    for name in written:
        dst = os.path.join(output_dir, name)
        if os.path.isdir(dst) and not os.path.islink(dst):
            shutil.rmtree(dst)
        os.replace(os.path.join(staging, name), dst)
    os.rmdir(staging)
    return written


def _push(a, folder: str, files: list[str] | None = None) -> str:
    from swift.model.hub import push_to_hub

    url = push_to_hub(folder, a.hub_model_id, use_hf=a.use_hf, token=a.hub_token, private=a.hub_private_repo,
                      commit_message=a.commit_message, files=files)
    logger.info(f"uploaded {folder} to {a.hub_model_id}: {url}")
    return url


def _terminated(signum, frame) -> None:
    raise SystemExit(128 + signum)


def export_main(args: ExportArguments | list[str] | None = None) -> dict[str, Any]:
    a = resolve_args(ExportArguments, args, "swift export")
    if a.options.uploads_as_is:
        folder = a.adapters[0] if a.adapters else a.model
        return {"uploaded": folder, "hub_model_id": a.hub_model_id, "commit": _push(a, folder)}
    if a.to_gguf:
        from swift.export.gguf import llama_cpp_version

        llama_cpp_version()  # the extra is there before any work
    parent = os.path.dirname(os.path.abspath(a.output_dir))
    os.makedirs(parent, exist_ok=True)
    name = os.path.basename(os.path.abspath(a.output_dir))
    staging = scratch = None
    result: dict[str, Any] = {"output_dir": a.output_dir}
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:  # a terminated export cleans up as an interrupted one does
        previous = signal.getsignal(signal.SIGTERM)  # None: a handler not set from Python
        signal.signal(signal.SIGTERM, _terminated)
    try:
        staging = tempfile.mkdtemp(dir=parent, prefix=f".{name}.partial-")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's folder is private; the export is an ordinary folder
        # beside the export, not in $TMPDIR: a merged model for --to_gguf is as large as the model
        scratch = tempfile.mkdtemp(dir=parent, prefix=f".{name}.scratch-")
        if a.to_cached_dataset:
            from swift.dataset.cache import INFO

            result.update(_cache_dataset(a, staging))
            _publish(staging, a.output_dir, replaces=("train", "val", INFO))
            return result
        hf_dir = _hf_source(a, staging, scratch)
        if a.merge_lora:
            result["merged"] = a.output_dir
        if a.quant_method == "bnb":
            _quantize_bnb(a, hf_dir, staging)
            result["quantized"] = a.output_dir
        elif a.quant_method == "gptq":
            from swift.export import gptq

            rows = gptq.calibration_rows(a.dataset, hf_dir, a.quant_n_samples, a.max_length, a.use_hf)
            gptq.quantize(hf_dir, staging, scratch, rows, a.quant_bits, a.group_size, a.quant_batch_size,
                          a.max_shard_size)
            result["quantized"] = a.output_dir
        if a.to_gguf:
            from swift.export.gguf import convert

            name = f"model-{a.gguf_type}.gguf"
            hf_dir = _runtime_view(hf_dir, scratch)
            convert(hf_dir, os.path.join(staging, name), a.gguf_type, a.llama_cpp_dir,
                    " + ".join([a.model or '', *a.adapters]).strip(" +"))
            metadata = _check_gguf_tokenizer(os.path.join(staging, name), hf_dir)
            result["gguf"] = os.path.join(a.output_dir, name)
            if a.to_ollama:
                from transformers import AutoTokenizer, GenerationConfig

                from swift.export.ollama import modelfile

                tokenizer = AutoTokenizer.from_pretrained(hf_dir)
                stop = [tokenizer.eos_token] if tokenizer.eos_token else []
                try:
                    eos = GenerationConfig.from_pretrained(hf_dir).eos_token_id
                    ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
                    stop += [tokenizer.convert_ids_to_tokens(i) for i in ids]
                except OSError:  # no generation_config.json
                    pass
                with open(os.path.join(staging, "Modelfile"), "w", encoding="utf-8") as f:
                    adds_bos = metadata.get("tokenizer.ggml.add_bos_token", "false").lower() == "true"
                    f.write(modelfile(tokenizer, name, stop, keep_bos=not adds_bos))
                result["modelfile"] = os.path.join(a.output_dir, "Modelfile")
        written = _publish(staging, a.output_dir)
    except BaseException:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    for key in ("merged", "quantized", "gguf", "modelfile"):
        if key in result:
            logger.info(f"{key}: {result[key]}")
    if a.push_to_hub:  # the export is on disk whatever the upload does
        result.update(uploaded=a.output_dir, hub_model_id=a.hub_model_id, commit=_push(a, a.output_dir, written))
    return result

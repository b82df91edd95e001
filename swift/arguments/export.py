"""Arguments of `swift export`, with ms-swift's flag names: which export runs (`--merge_lora`,
`--quant_method`, `--to_gguf`/`--to_ollama`, `--to_cached_dataset`, `--push_to_hub`), and each flag
checked against it (a flag the chosen export does not read is refused in one line)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import ClassVar

from swift.app.runs import not_console_files
from swift.arguments.base import ComposedArguments
from swift.utils.registry import SwiftError

# the order, #N sample and split of a cached dataset's rows by default: training's default --seed
CACHE_SEED = 42
# --max_shard_size: a number and a unit, read here once into bytes (what transformers and gptqmodel are given):
# KB, MB, GB, TB are powers of 1000 (as transformers reads them), KiB, MiB, GiB, TiB powers of 1024
SHARD_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMGT]i?B|B)", re.IGNORECASE)
SHARD_UNITS = {"b": 1, **{f"{p}b": 1000 ** (i + 1) for i, p in enumerate("kmgt")},
               **{f"{p}ib": 1024 ** (i + 1) for i, p in enumerate("kmgt")}}


def shard_bytes(size: str) -> int:
    """--max_shard_size in bytes: `5GB`, `500MB`, `1.5GB`, `2GiB` (no space; a unit is required)."""
    match = SHARD_SIZE.fullmatch(str(size).strip())
    value = int(float(match[1]) * SHARD_UNITS[match[2].lower()]) if match else 0
    if value < 1:
        raise SwiftError(f"--max_shard_size {size!r} is not a size such as 5GB, 500MB, 1.5GB or 2GiB (a number and "
                         "one of the units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    return value


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
        "help": "Write into an --output_dir that already has files, once the export succeeded: files of the same "
                "names are replaced, the files an earlier `swift export` there listed in its export_args.json are "
                "removed, and no other file is touched (an HF checkpoint is refused beside weight files no export "
                "listed)."})
    merge_lora: bool = field(default=False, metadata={
        "help": "Write the model with --adapters merged into it, as a standalone HF checkpoint."})
    torch_dtype: str = field(default="auto", metadata={
        "help": "dtype of merged weights (auto: the base checkpoint's dtype)."})
    safe_serialization: bool = field(default=True, metadata={
        "help": "HF weights are saved as safetensors (false is refused: transformers 5 writes safetensors only)."})
    max_shard_size: str = field(default="5GB", metadata={
        "help": "Largest HF weight file: a number and a unit, B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, "
                "TiB (powers of 1024), e.g. 5GB, 500MB, 1.5GB, 2GiB."})
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
    def max_shard_bytes(self) -> int:
        return shard_bytes(self.max_shard_size)

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
        self.data_args()  # training's own checks of the row flags (--val_dataset with --split_dataset_ratio too)

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
        shard_bytes(self.max_shard_size)
        if not self.safe_serialization:
            raise SwiftError("--safe_serialization false: transformers 5 writes HF weights as safetensors only")
        if not (self.merge_lora or self.quant_method):  # no HF checkpoint is written
            unread = [f for f, default in (("torch_dtype", "auto"), ("safe_serialization", True),
                                           ("max_shard_size", "5GB")) if getattr(self, f) != default]
            if unread:
                raise SwiftError(f"--{unread[0]} shapes the HF checkpoint that --merge_lora or --quant_method writes; "
                                 "it is not read here")
        if self.to_gguf and self.llama_cpp_dir:
            from swift.export.gguf import check_llama_cpp_dir

            check_llama_cpp_dir(self.llama_cpp_dir)
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
        if os.path.isdir(self.output_dir) and not self.exist_ok and not_console_files(os.listdir(self.output_dir)):
            raise SwiftError(f"--output_dir {self.output_dir} already has files; pass --exist_ok true to write into it")
        if os.path.exists(self.output_dir) and not os.path.isdir(self.output_dir):
            raise SwiftError(f"--output_dir {self.output_dir} is a file")
        if self.merge_lora or self.quant_method:
            from swift.export.publish import unlisted_weights

            stale = unlisted_weights(self.output_dir)
            if stale:
                raise SwiftError(f"--output_dir {self.output_dir} has weight files no earlier export there listed "
                                 f"({', '.join(stale)}), which could load beside the new checkpoint; remove them or "
                                 "pick another --output_dir")
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

    @staticmethod
    def outputs_read(values: dict) -> set[str]:
        """The output flags a run with these flag values reads (the web console sets those): all but
        --push_to_hub alone, which uploads a folder as it is."""
        writes = any(values.get(f) for f in ("merge_lora", "to_gguf", "to_ollama", "quant_method", "to_cached_dataset"))
        return {"output_dir"} if writes or not values.get("push_to_hub") else set()

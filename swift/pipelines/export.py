"""`swift export`: merge LoRA adapters, quantize (bnb, GPTQ), write GGUF for llama.cpp (f16, q8_0,
q4_k_m) and an Ollama Modelfile beside it, save pre-encoded datasets, upload to a hub; ms-swift's flag
names (swift/arguments/export.py).

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
from types import SimpleNamespace
from typing import Any

from swift.arguments.export import ExportArguments
from swift.export.publish import MANIFEST, publish
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
# a classification model's head, by its class name in config.json (as merge_lora.head_of names it)
HEADS = {"ForSequenceClassification": "seq_cls", "ForTokenClassification": "token_cls"}


def _generation_tags_as_blocks(template: str) -> str:
    return GENERATION_TAG.sub(lambda m: f"{{%{m[1]} {_GENERATION_BLOCK[m[2]]} {m[3]}%}}", template)


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


def config_head(model_dir: str) -> tuple[str, int | None]:
    """(task_type, num_labels) of the checkpoint in `model_dir`, read from its config's architecture."""
    path = os.path.join(model_dir, "config.json")
    config = read_json(path) if os.path.isfile(path) else {}
    for suffix, task_type in HEADS.items():
        if any(str(arch).endswith(suffix) for arch in config.get("architectures") or []):
            return task_type, len(config["id2label"]) if config.get("id2label") else config.get("num_labels")
    return "causal_lm", None


def _refuse_head(a, task_type: str, base: str) -> None:
    """GPTQ (gptqmodel loads causal LMs) and GGUF (llama.cpp's converter writes LMs) would drop a reward
    model's or a classifier's head and give a language model: refused before any work."""
    if task_type == "causal_lm":
        return
    flag = "--to_gguf" if a.to_gguf else "--quant_method gptq" if a.quant_method == "gptq" else None
    if flag:
        raise SwiftError(f"{flag}: {' + '.join([base, *a.adapters])} is a {task_type} model (a classification "
                         "head), which this format would drop; export it with --merge_lora or --quant_method bnb")


def _hf_source(a, staging: str, scratch: str) -> str:
    """An HF checkpoint folder of the model to export, adapters merged: `<staging>` itself with
    --merge_lora (it is part of the export), a folder in `scratch` when it had to be written, else
    the model's own folder."""
    from swift.model.loader import resolve_model_dir
    from swift.pipelines.merge_lora import base_model_of, head_of, merged_model

    base = a.model or base_model_of(a.adapters[0])
    model_dir, builtin = resolve_model_dir(base, use_hf=a.use_hf)
    config = os.path.join(model_dir, "config.json")
    if os.path.isfile(config) and read_json(config).get("quantization_config"):
        raise SwiftError(f"--model {base} is a quantized checkpoint already; export from the unquantized model")
    _refuse_head(a, head_of(a.adapters[0])[0] if a.adapters else config_head(model_dir)[0], base)
    if not (a.adapters or builtin or not _has_weights(model_dir)):
        return model_dir
    target = staging if a.merge_lora else os.path.join(scratch, "hf")
    model, tokenizer = merged_model(base, a.adapters, torch_dtype=a.torch_dtype, use_hf=a.use_hf)
    model.config._name_or_path = a.output_dir
    model.save_pretrained(target, max_shard_size=a.options.max_shard_bytes)
    tokenizer.save_pretrained(target)
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
    task_type, num_labels = config_head(hf_dir)  # a reward model keeps its head
    model, tokenizer, _ = load_model(hf_dir, torch_dtype=dtype, task_type=task_type, num_labels=num_labels,
                                     quantization=bnb_config(SimpleNamespace(**flags, torch_dtype=dtype)))
    model.config._name_or_path = a.output_dir
    model.save_pretrained(staging, max_shard_size=a.options.max_shard_bytes)
    tokenizer.save_pretrained(staging)


def _quantize(a, hf_dir: str, staging: str, scratch: str) -> None:
    if a.quant_method == "bnb":
        _quantize_bnb(a, hf_dir, staging)
    else:
        from swift.export import gptq

        rows = gptq.calibration_rows(a.dataset, hf_dir, a.quant_n_samples, a.max_length, a.use_hf)
        gptq.quantize(hf_dir, staging, scratch, rows, a.quant_bits, a.group_size, a.quant_batch_size,
                      a.options.max_shard_bytes)


def _write_gguf(a, hf_dir: str, staging: str, scratch: str) -> dict[str, str]:
    """The GGUF by llama.cpp's tools, its tokenizer checked, and with --to_ollama the Modelfile."""
    from swift.export.gguf import convert

    name = f"model-{a.gguf_type}.gguf"
    hf_dir = _runtime_view(hf_dir, scratch)
    convert(hf_dir, os.path.join(staging, name), a.gguf_type, a.llama_cpp_dir,
            " + ".join([a.model or '', *a.adapters]).strip(" +"), _model_name(a))
    metadata = _check_gguf_tokenizer(os.path.join(staging, name), hf_dir)
    written = {"gguf": os.path.join(a.output_dir, name)}
    if a.to_ollama:
        from swift.export.ollama import write_modelfile

        write_modelfile(hf_dir, staging, name, metadata)
        written["modelfile"] = os.path.join(a.output_dir, "Modelfile")
    return written


def _model_name(a) -> str:
    """The GGUF's `general.name`: the model's folder or hub name, and the last adapter's folder name."""
    from swift.pipelines.merge_lora import base_model_of

    base = a.model or base_model_of(a.adapters[0])
    names = [base.removeprefix("builtin:"), *a.adapters[-1:]]
    return "-".join(os.path.basename(os.path.normpath(n)) for n in names)


def _write_manifest(a, staging: str) -> None:
    """export_args.json: the flags, and the names this export writes (what a later export with
    --exist_ok replaces; swift/export/publish.py)."""
    from swift.pipelines.merge_lora import base_model_of

    files = sorted({*os.listdir(staging), MANIFEST})
    write_json(os.path.join(staging, MANIFEST), {**a.to_dict(), "model": a.model or base_model_of(a.adapters[0]),
                                                 "files": files})


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
            from swift.dataset.cache import INFO, encode_and_save

            result.update(encode_and_save(a, staging))
            publish(staging, a.output_dir, replaces=("train", "val", INFO))
            return result
        hf_dir = _hf_source(a, staging, scratch)
        if a.merge_lora:
            result["merged"] = a.output_dir
        if a.quant_method:
            _quantize(a, hf_dir, staging, scratch)
            result["quantized"] = a.output_dir
        if a.to_gguf:
            result.update(_write_gguf(a, hf_dir, staging, scratch))
        _write_manifest(a, staging)
        written = publish(staging, a.output_dir)
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

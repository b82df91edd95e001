"""Load a model and its tokenizer from a local directory, a hub id, or the built-in tiny model."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification,
                          AutoModelForTokenClassification, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase)

from swift.model.hub import snapshot_download
from swift.utils.imports import gptqmodel_environment_kept
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)

BUILTIN_PREFIX = "builtin:"
ASSETS = Path(__file__).parent / "assets"
BUILTIN_SEED = 0  # the built-in model's weights are a pure function of this seed
AUTO_CLASSES = {"causal_lm": AutoModelForCausalLM, "seq_cls": AutoModelForSequenceClassification,
                "token_cls": AutoModelForTokenClassification}


@dataclass
class ModelInfo:
    model_id: str  # what the user passed
    model_dir: str  # where config and tokenizer files live
    model_type: str
    builtin: bool


def resolve_model_dir(model: str, *, use_hf: bool = False, revision: str | None = None) -> tuple[str, bool]:
    """Return (local directory, is_builtin) for a model spec, downloading hub ids."""
    if model.startswith(BUILTIN_PREFIX):
        name = model[len(BUILTIN_PREFIX):]
        path = ASSETS / name
        if not path.is_dir():
            valid = sorted(p.name for p in ASSETS.iterdir() if p.is_dir())
            raise SwiftError(f"unknown built-in model '{model}'; valid: {', '.join(BUILTIN_PREFIX + v for v in valid)}")
        return str(path), True
    if os.path.isdir(model):
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise SwiftError(f"--model {model}: directory has no config.json (is it a LoRA adapter? use --adapters)")
        return model, False
    if os.path.exists(model) or model.startswith((".", "/")) or model.count("/") != 1:
        raise SwiftError(f"--model {model}: no such local directory, and not a hub id of the form 'org/name'")
    return snapshot_download(model, use_hf=use_hf, revision=revision), False


def resolve_dtype(torch_dtype: str) -> torch.dtype:
    if torch_dtype == "auto":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return getattr(torch, torch_dtype)


# the files a tokenizer's vocabulary is read from (fast, sentencepiece, BPE, WordPiece, tiktoken)
VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
               "sentencepiece.bpe.model")


def load_tokenizer(model_dir: str) -> PreTrainedTokenizerBase:
    """The directory's tokenizer; one without vocabulary files is refused (transformers would build an
    empty tokenizer from the config alone)."""
    import json

    names = os.listdir(model_dir)
    remote = False  # a tokenizer of the model's own code reads files of its own
    if "tokenizer_config.json" in names:
        with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
            remote = "auto_map" in json.load(f)
    if not (remote or any(n in VOCAB_FILES or n.endswith(".tiktoken") for n in names)):
        raise SwiftError(f"--model {model_dir}: no tokenizer files there (one of {', '.join(VOCAB_FILES)}); copy "
                         "them from the model the weights came from")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


ATTN_NAMES = {"flash_attn": "flash_attention_2", "flash_attention_2": "flash_attention_2",
              "flash_attention_3": "flash_attention_3", "sdpa": "sdpa", "eager": "eager",
              "flex_attention": "flex_attention"}


def attention(name: str) -> str:
    """HF's attn_implementation for `--attn_impl` (ms-swift's `flash_attn` included); FlashAttention
    needs its package and a CUDA GPU, which is said in one line rather than in HF's traceback."""
    if name not in ATTN_NAMES:
        raise SwiftError(f"--attn_impl {name!r} is not one of {', '.join(ATTN_NAMES)}")
    impl = ATTN_NAMES[name]
    package = {"flash_attention_2": ("flash_attn", "flash-attn"),
               "flash_attention_3": ("flash_attn_interface", "flash-attn-3")}.get(impl)
    if package:
        import importlib.util

        if not torch.cuda.is_available() or importlib.util.find_spec(package[0]) is None:
            raise SwiftError(f"--attn_impl {name} needs a CUDA GPU and the {package[1]} package; use --attn_impl sdpa "
                             "(the default) here")
    return impl


def builtin_dir(model: str) -> str:
    """A built-in model written out as an ordinary directory (once per machine), for loaders that
    read from disk (vLLM, quantized loading)."""
    import tempfile

    path = os.path.join(tempfile.gettempdir(), "swift-" + model.replace(":", "-"))
    if not os.path.isfile(os.path.join(path, "config.json")):
        hf_model, tokenizer, _ = load_model(model, torch_dtype="float32")
        hf_model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


def bnb_config(args):
    """The bitsandbytes config of `--quant_bits 4|8` (and the `--bnb_4bit_*` flags), or None."""
    bits = getattr(args, "quant_bits", None)
    if not bits:
        return None
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        raise SwiftError('--quant_bits needs the bitsandbytes package: pip install -e ".[qlora]"')
    from transformers import BitsAndBytesConfig

    if bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    storage = args.bnb_4bit_quant_storage
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=args.bnb_4bit_quant_type,
                              bnb_4bit_compute_dtype=resolve_dtype(args.bnb_4bit_compute_dtype or args.torch_dtype),
                              bnb_4bit_use_double_quant=args.bnb_4bit_use_double_quant,
                              bnb_4bit_quant_storage=getattr(torch, storage) if storage else torch.uint8)


def check_model_files(model_dir: str) -> None:
    """`--check_model`: every safetensors file of the directory has a readable header and is as long
    as its header says (a cut download fails here, in one line, rather than deep inside loading)."""
    import json
    import struct

    for name in sorted(os.listdir(model_dir)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(model_dir, name)
        try:
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if os.path.getsize(path) < 8 + n + end:
                raise ValueError(f"{os.path.getsize(path)} bytes, its header describes {8 + n + end}")
        except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
            raise SwiftError(f"--model {model_dir}: weight file {name} is damaged ({e}); download it again, or pass "
                             "--check_model false to skip this check") from None


@contextlib.contextmanager
def whole_weights():
    """Build a model from its config with whole tensors even under ZeRO-3, whose partitioned
    construction initialises weights differently: the built-in model's weights stay a function of
    its seed alone (DeepSpeed partitions them when the trainer starts)."""
    from transformers.integrations import deepspeed as hf_deepspeed

    saved = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = saved


def load_model(
    model: str,
    *,
    use_hf: bool = False,
    revision: str | None = None,
    torch_dtype: str = "auto",
    attn_impl: str | None = None,
    task_type: str = "causal_lm",
    num_labels: int | None = None,
    device: str | torch.device | None = None,
    check_model: bool = False,
    quantization=None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, ModelInfo]:
    """`quantization`: a transformers quantization config (`bnb_config`), for models loaded from disk;
    the built-in model is written to a directory first."""
    model_dir, builtin = resolve_model_dir(model, use_hf=use_hf, revision=revision)
    if check_model and not builtin:
        check_model_files(model_dir)
    tokenizer = load_tokenizer(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    dtype = resolve_dtype(torch_dtype)
    auto_cls = AUTO_CLASSES[task_type]
    if task_type != "causal_lm":
        config.num_labels = num_labels or (1 if task_type == "seq_cls" else 2)
        config.pad_token_id = tokenizer.pad_token_id
    kwargs = {"attn_implementation": attention(attn_impl)} if attn_impl else {}
    if quantization is not None:
        kwargs["quantization_config"] = quantization
        if builtin:
            model_dir, builtin = builtin_dir(model), False
    if builtin:
        with torch.random.fork_rng(devices=[]), whole_weights():
            torch.manual_seed(BUILTIN_SEED)
            hf_model = auto_cls.from_config(config, dtype=dtype, **kwargs)
        # Recorded in adapter configs and args.json, so a LoRA trained on it can find its base again.
        hf_model.config._name_or_path = model
        hf_model.name_or_path = model
    else:
        with gptqmodel_environment_kept():  # a GPTQ checkpoint's load imports gptqmodel
            hf_model = auto_cls.from_pretrained(model_dir, config=config, dtype=dtype, **kwargs)
    rows = getattr(hf_model.get_input_embeddings(), "num_embeddings", None)  # whole even under ZeRO-3
    if rows is not None and tokenizer.vocab_size > rows:
        raise SwiftError(f"--model {model}: its tokenizer has {tokenizer.vocab_size} tokens but the model's embedding "
                         f"only {rows} rows (a tokenizer from another model?)")
    if rows is not None and len(tokenizer) > rows:  # added tokens only: Gemma-3's <image_soft_token>, CodeLlama's
        beyond = [t for t, i in tokenizer.get_added_vocab().items() if i >= rows]
        logger.warning(f"--model {model}: {len(beyond)} added token(s) of its tokenizer have no embedding row "
                       f"({', '.join(beyond[:5])}{', ...' if len(beyond) > 5 else ''}); a text holding one cannot "
                       "be used with this model")
    if device is not None:
        hf_model.to(device)
    info = ModelInfo(model_id=model, model_dir=model_dir, model_type=config.model_type,
                     builtin=model.startswith(BUILTIN_PREFIX))
    return hf_model, tokenizer, info

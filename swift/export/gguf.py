"""GGUF export through llama.cpp's own tools: its `convert_hf_to_gguf.py` writes f16 / q8_0, and its
quantizer (`llama_model_quantize`, reached through llama-cpp-python) makes the k-quants from the f16
file. Nothing here writes GGUF bytes itself.

llama.cpp's converter is not in any installed package: it ships in llama.cpp's source tree, which
the llama-cpp-python source distribution carries (`vendor/llama.cpp`). `--llama_cpp_dir` (or
`$LLAMA_CPP_DIR`) names a llama.cpp checkout; without one, the source distribution of the installed
llama-cpp-python version is fetched once from the package index (`pip download`) and the converter
kept in the user's cache.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from swift.utils.io import cache_home
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)

GGUF_TYPES = ("f16", "q8_0", "q4_k_m")
CONVERTER_TYPES = {"f16", "q8_0"}  # written by convert_hf_to_gguf.py itself; the rest by the quantizer
EXTRA = 'pip install -e ".[gguf]"'
CONVERTER = "convert_hf_to_gguf.py"
# what the converter needs from llama.cpp's tree (besides itself)
CONVERTER_PARTS = ("conversion/", "gguf-py/")
# what swift.export.run_converter imports from the tree: llama.cpp's checkouts before the converter was split
# into the `conversion` package have only convert_hf_to_gguf.py
CONVERTER_FILES = (CONVERTER, "conversion/base.py", "gguf-py/gguf/__init__.py")


def llama_cpp_version() -> str:
    try:
        import llama_cpp
    except ImportError:
        raise SwiftError(f"--to_gguf needs llama-cpp-python and gguf (the [gguf] extra): {EXTRA}") from None
    return llama_cpp.__version__


def check_llama_cpp_dir(path: str) -> None:
    """A llama.cpp checkout with the converter files this project runs."""
    if not os.path.isfile(os.path.join(path, CONVERTER)):
        raise SwiftError(f"--llama_cpp_dir {path}: no {CONVERTER} there (not a llama.cpp checkout)")
    missing = [f for f in CONVERTER_FILES if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise SwiftError(f"--llama_cpp_dir {path}: no {missing[0]} there (a llama.cpp checkout older than its "
                         "converter's conversion/ package, which this project runs; use a newer checkout)")


def converter_dir(llama_cpp_dir: str | None) -> Path:
    """A directory holding llama.cpp's `convert_hf_to_gguf.py` (and what it imports)."""
    given = llama_cpp_dir or os.environ.get("LLAMA_CPP_DIR")
    if given:
        check_llama_cpp_dir(given)
        return Path(given)
    version = llama_cpp_version()
    home = Path(cache_home()) / "llama.cpp" / version
    if (home / CONVERTER).is_file():
        return home
    logger.info(f"fetching llama.cpp's converter: the llama-cpp-python {version} source from the package index")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={version}", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        archives = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if proc.returncode != 0 or not archives:
            last = (proc.stderr.strip().splitlines() or ["no archive downloaded"])[-1]
            raise SwiftError(f"--to_gguf: could not fetch llama.cpp's converter (llama-cpp-python {version}'s source "
                             f"from the package index: {last}); pass --llama_cpp_dir with a llama.cpp checkout")
        home.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=home.parent, prefix=".partial-"))
        try:
            with tarfile.open(archives[0]) as tar:
                for member in tar.getmembers():
                    _, _, rest = member.name.partition("/vendor/llama.cpp/")
                    if member.isfile() and (rest == CONVERTER or rest.startswith(CONVERTER_PARTS)):
                        member.name = rest
                        tar.extract(member, staging, filter="data")  # refuses paths outside `staging`
            if not (staging / CONVERTER).is_file():
                raise SwiftError(f"--to_gguf: llama-cpp-python {version}'s source has no vendor/llama.cpp/{CONVERTER}; "
                                 "pass --llama_cpp_dir with a llama.cpp checkout")
        except (tarfile.TarError, OSError) as e:
            shutil.rmtree(staging, ignore_errors=True)
            raise SwiftError(f"--to_gguf: llama-cpp-python {version}'s source could not be unpacked ({e}); pass "
                             "--llama_cpp_dir with a llama.cpp checkout") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    try:
        staging.rename(home)
    except OSError:  # another export fetched it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return home


# Qwen2's split rule (its tokenizer.json), which llama.cpp runs as pre-tokenizer "qwen2"
QWEN2_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
               "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def llama_pre_tokenizer(model_dir: str) -> str | None:
    """llama.cpp's name for a byte-level BPE tokenizer's pre-tokenizer, read from its structure in
    tokenizer.json. llama.cpp's converter recognises a pre-tokenizer by the hash of one text's tokens,
    which only the tokenizers it lists have; a tokenizer built with the same rules as a listed one (the
    built-in model's) gets that one's name:
    - GPT-2's byte-level rules alone: "gpt-2";
    - digits split off one by one, then GPT-2's rules (StarCoder's, Refact's): "refact";
    - NFC, then Qwen2's split rule and bytes (what transformers saves for a qwen2 model): "qwen2".
    None for any other structure (the converter then refuses the tokenizer)."""
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    model = tok.get("model") or {}
    # llama.cpp applies a BPE vocabulary's merges to every piece, with no word prefixes or suffixes
    if (model.get("type") != "BPE" or model.get("ignore_merges") or model.get("continuing_subword_prefix")
            or model.get("end_of_word_suffix") or model.get("dropout")):
        return None
    normalizer = (tok.get("normalizer") or {}).get("type")
    pre = tok.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]

    def byte_level(p, regex: bool) -> bool:
        return p.get("type") == "ByteLevel" and p.get("use_regex", True) == regex and not p.get("add_prefix_space")

    def split(p, pattern: str) -> bool:
        return (p.get("type") == "Split" and p.get("pattern") == {"Regex": pattern}
                and p.get("behavior") == "Isolated" and not p.get("invert"))

    if normalizer is None and len(steps) == 1 and byte_level(steps[0], True):
        return "gpt-2"
    if normalizer is None and len(steps) == 2 and split(steps[0], "\\p{N}") and byte_level(steps[1], True):
        return "refact"
    if normalizer == "NFC" and len(steps) == 2 and split(steps[0], QWEN2_SPLIT) and byte_level(steps[1], False):
        return "qwen2"
    return None


def convert(model_dir: str, out_file: str, gguf_type: str, llama_cpp_dir: str | None, name: str,
            model_name: str) -> None:
    """Write `model_dir` (an HF checkpoint with its tokenizer; `name`: what the user called it) as GGUF of
    `gguf_type` to `out_file`, named `model_name` in its metadata (`general.name`; the converter would
    name it after `model_dir`, a scratch folder)."""
    llama_cpp_version()  # the extra is there before anything is fetched
    tree = converter_dir(llama_cpp_dir)
    outtype = gguf_type if gguf_type in CONVERTER_TYPES else "f16"
    target = out_file if gguf_type in CONVERTER_TYPES else out_file + ".f16.tmp"
    cmd = [sys.executable, "-m", "swift.export.run_converter", str(tree), llama_pre_tokenizer(model_dir) or "",
           model_dir, "--outfile", target, "--outtype", outtype, "--model-name", model_name]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if "Error" in line or "error" in line), lines[-1] if lines
                      else f"exit code {proc.returncode}")
        if "not supported" in reason or "not recognized" in reason:
            reason += " (a model family llama.cpp's converter does not support)"
        raise SwiftError(f"--to_gguf: llama.cpp's converter failed on {name}: {reason.strip()}")
    if gguf_type not in CONVERTER_TYPES:
        try:
            quantize(target, out_file, gguf_type)
        finally:
            os.remove(target)


def quantize(src: str, dst: str, gguf_type: str) -> None:
    """llama.cpp's quantizer, from an f16 GGUF to `gguf_type` (its names: q4_k_m = LLAMA_FTYPE_MOSTLY_Q4_K_M)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{gguf_type.upper()}")
    params.nthread = os.cpu_count() or 1
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params) != 0:
        raise SwiftError(f"--gguf_type {gguf_type}: llama.cpp's quantizer failed on {src}")

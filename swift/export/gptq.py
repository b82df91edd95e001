"""GPTQ export through gptqmodel (requirements/gptq.txt): the model's linear layers quantized layer by layer
against calibration rows (GPTQ's second-order weight update), saved as an HF checkpoint with its
`quantization_config`, which transformers (with gptqmodel and optimum installed) and vLLM load.

The calibration rows are `--dataset` rows encoded by the model's own chat template, as training
encodes them (prompt and answer), cut to `--max_length` tokens.
"""
from __future__ import annotations

import os

from swift.utils.imports import gptqmodel_environment_kept
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)

INSTALL = "pip install --no-deps -r requirements/gptq.txt"
GPTQ_BITS = (2, 3, 4, 8)
DEFAULT_DATASET = "builtin:arith-sft"
# gptqmodel silently drops calibration rows shorter than this (its `calibration_data_min_length`,
# which its quantize() does not pass on); they are counted as unusable here instead
MIN_TOKENS = 10


def check_installed() -> None:
    """Imports gptqmodel (and optimum), so that a missing or broken install stops before any work."""
    import importlib

    # gptqmodel's CPU pool defaults to half the cores, and its model loader asks for 2 workers: on a
    # 2-core machine that default (1) fails at load; its own default elsewhere. Read at import.
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(min(12, max(2, ((os.cpu_count() or 1) + 1) // 2))))
    missing = []
    with gptqmodel_environment_kept():
        for name in ("gptqmodel", "optimum"):
            try:
                importlib.import_module(name)
            except ImportError as e:  # the package, or a module it imports
                missing.append(name if e.name in (None, name) else f"{e.name} (imported by {name})")
    if missing:
        raise SwiftError(f"--quant_method gptq needs {' and '.join(missing)}: {INSTALL} (the file says why not "
                         "an extra)")


def calibration_rows(specs: list[str], hf_dir: str, n_samples: int, max_length: int, use_hf: bool) -> list[dict]:
    """Up to `n_samples` rows of `specs` as token ids (chat template applied, prompt and answer), each
    cut to `max_length` tokens; one line naming the dataset when none is usable."""
    from transformers import AutoConfig, AutoTokenizer

    from swift.dataset.loader import load_rows
    from swift.template import RowError, get_template, infer_template

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    template = get_template(infer_template(AutoConfig.from_pretrained(hf_dir).model_type, tokenizer), tokenizer)
    loaded = load_rows(specs, use_hf=use_hf)
    rows, why = [], {}
    for row, origin in zip(loaded.rows, loaded.origins):
        try:
            ids = template.encode(row).input_ids[:max_length]
        except RowError as e:
            why.setdefault(str(e), origin)
            continue
        if len(ids) < MIN_TOKENS:
            why.setdefault(f"fewer than {MIN_TOKENS} tokens", origin)
            continue
        rows.append({"input_ids": ids, "attention_mask": [1] * len(ids)})
        if len(rows) == n_samples:
            break
    if not rows:
        reasons = "; ".join(f"{reason} (first: {origin})" for reason, origin in why.items()) or "it has no rows"
        raise SwiftError(f"--dataset {' '.join(specs)}: no row is usable as GPTQ calibration data: {reasons}")
    short = f" (--quant_n_samples {n_samples}: the dataset has no more usable ones)" if len(rows) < n_samples else ""
    logger.info(f"GPTQ calibration: {len(rows)} rows of {' '.join(specs)}, up to {max_length} tokens each{short}")
    return rows


def quantize(hf_dir: str, out_dir: str, scratch: str, rows: list[dict], bits: int, group_size: int,
             batch_size: int, max_shard_size: str) -> None:
    """gptqmodel's GPTQ of the checkpoint in `hf_dir`, saved into `out_dir` (weights, config with its
    quantization_config, tokenizer files)."""
    check_installed()
    from gptqmodel import GPTQModel, QuantizeConfig

    config = QuantizeConfig(bits=bits, group_size=group_size, desc_act=False, sym=True,
                            offload_to_disk_path=os.path.join(scratch, "gptq-offload"))
    hf_dir, out_dir = os.path.abspath(hf_dir), os.path.abspath(out_dir)
    cwd = os.getcwd()
    # gptqmodel writes a log file per quantize into ./logs of the working directory: the scratch folder's
    os.chdir(scratch)
    try:
        _quantize(GPTQModel, hf_dir, out_dir, config, rows, batch_size, max_shard_size)
    finally:
        os.chdir(cwd)


def _quantize(GPTQModel, hf_dir: str, out_dir: str, config, rows: list[dict], batch_size: int,
              max_shard_size: str) -> None:
    try:
        model = GPTQModel.load(hf_dir, config, device=None if _cuda() else "cpu")
    except (TypeError, ValueError, KeyError, AttributeError, NotImplementedError) as e:
        # a model type gptqmodel does not list gets a module tree it detects itself; this is what fails
        raise SwiftError(f"--quant_method gptq: gptqmodel cannot load this model for quantizing "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    model.quantize(rows, batch_size=batch_size)
    model.save(out_dir, max_shard_size=max_shard_size)
    _without_local_paths(out_dir)


def _without_local_paths(out_dir: str) -> None:
    """gptqmodel records its offload folder (in our scratch folder, gone after the export) in the saved
    configs' metadata: a path of this machine that an upload would publish."""
    from swift.utils.io import read_json, write_json

    for name, key in (("config.json", "quantization_config"), ("quantize_config.json", None)):
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            config = read_json(path)
            meta = (config.get(key) if key else config or {}).get("meta") or {}
            if meta.pop("offload_to_disk_path", None) is not None:
                mode = os.stat(path).st_mode
                write_json(path, config)
                os.chmod(path, mode)  # as gptqmodel wrote it (write_json's temporary file is private)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()

"""Encoded datasets on disk: `swift export --to_cached_dataset` writes them, `swift sft|pt
--cached_dataset` trains on them without reading or tokenizing any row.

A cache is a folder with `train/` (and `val/` when the export held rows out) saved by the `datasets`
library (Arrow files, memory-mapped when loaded) and `cache_info.json`, which records how the rows were
encoded: the template and its settings, and digests of the tokenizer and chat template. A run whose own
template would encode differently is refused, so a cache never trains a model on other tokens than its
rows would give it.
"""
from __future__ import annotations

import hashlib
import json
import os

from torch.utils.data import Dataset

from swift.utils.io import read_json, write_json
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)
INFO = "cache_info.json"
FORMAT = 1


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def encoding_of(template) -> dict:
    """What decides the tokens a row becomes: equal encodings encode every row alike."""
    tokenizer = template.tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocab = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    specials = json.dumps({"map": tokenizer.special_tokens_map, "eos": tokenizer.eos_token_id,
                           "pad": tokenizer.pad_token_id}, sort_keys=True, default=str)
    chat_template = getattr(tokenizer, "chat_template", None) or ""
    if not isinstance(chat_template, str):  # several named templates
        chat_template = json.dumps(chat_template, sort_keys=True)
    cls = type(template)
    return {"format": FORMAT, "template": template.name, "template_class": f"{cls.__module__}.{cls.__qualname__}",
            "system": template.system,
            "max_length": template.max_length, "truncation_strategy": template.truncation_strategy,
            "loss_scale": template.loss_scale, "tokenizer_sha256": _sha256(vocab + specials),
            "chat_template_sha256": _sha256(chat_template)}


def write_cache(folder: str, train: list[dict], val: list[dict], encoding: dict, source: dict) -> None:
    from datasets import Dataset as ArrowDataset

    ArrowDataset.from_list(train).save_to_disk(os.path.join(folder, "train"))
    if val:
        ArrowDataset.from_list(val).save_to_disk(os.path.join(folder, "val"))
    write_json(os.path.join(folder, INFO), {"encoding": encoding, "rows": {"train": len(train), "val": len(val)},
                                            **source})


def encode_and_save(a, folder: str) -> dict:
    """`swift export --to_cached_dataset` (`a`: its arguments) into `folder`: --dataset read, split and
    encoded as `swift sft` does (the same functions, the run's data seed), saved with its encoding."""
    from transformers import AutoConfig

    from swift.arguments.template import model_max_length
    from swift.dataset.encode import encode_rows
    from swift.dataset.loader import read_rows
    from swift.model.loader import load_tokenizer, resolve_model_dir
    from swift.template import choose_template, get_template

    model_dir, _ = resolve_model_dir(a.model, use_hf=a.use_hf)
    tokenizer = load_tokenizer(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    name = choose_template(a.template, None, config.model_type, tokenizer)
    # --max_length's default as training resolves it (the model's context), recorded as that number
    max_length = a.max_length if a.max_length is not None else model_max_length(config)
    template = get_template(name, tokenizer, system=a.system, max_length=max_length,
                            truncation_strategy=a.truncation_strategy, loss_scale=a.loss_scale)
    data = a.options.data_args()
    train_rows, val_rows = read_rows(data, a.seed, a.use_hf)
    train = encode_rows(train_rows, template, strict=data.strict, desc="encode train", num_proc=a.dataset_num_proc)
    train_rows.report("train dataset")
    if not train:
        raise SwiftError(f"--dataset {' '.join(a.dataset)}: no row could be encoded; see the dropped-row report above")
    val = []
    if len(val_rows):
        val = encode_rows(val_rows, template, strict=data.strict, desc="encode val", num_proc=a.dataset_num_proc)
        val_rows.report("val dataset")
    write_cache(folder, train, val, encoding_of(template),
                {"model": a.model, "dataset": a.dataset, "val_dataset": a.val_dataset,
                 "split_dataset_ratio": a.split_dataset_ratio, "seed": a.seed})
    logger.info(f"encoded {len(train)} train and {len(val)} val rows with template {name}")
    return {"cached_dataset": a.output_dir, "train_rows": len(train), "val_rows": len(val)}


class CachedRows(Dataset):
    """The rows of a saved split, each a dict of lists (a `datasets.Dataset` is wrapped so that the
    Trainer does not drop its columns by the model's signature)."""

    def __init__(self, table):
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: int) -> dict:
        return self.table[i]


# what a differing encoding key is called in the one-line refusal (other keys are flags)
_NAMES = {"tokenizer_sha256": "another tokenizer", "chat_template_sha256": "another chat template",
          "format": "another cache format", "template_class": "another template class"}


def load_cache(folder: str, encoding: dict, seed: int, flag: str = "--cached_dataset"):
    """(train table, val table or None) of a cache written for `encoding` with rows read, shuffled and
    split with `seed`; one line when it is not a cache, or was made otherwise."""
    from datasets import load_from_disk

    path = os.path.join(folder, INFO)
    if not os.path.isfile(path):
        raise SwiftError(f"{flag} {folder}: no {INFO} there (not written by `swift export --to_cached_dataset`)")
    try:
        info = read_json(path)
        recorded, rows = info["encoding"], info["rows"]
    except (ValueError, KeyError, TypeError) as e:
        raise SwiftError(f"{flag} {folder}: {INFO} is not readable ({type(e).__name__}: {e})") from None
    for key, value in encoding.items():
        if recorded.get(key) != value:
            what = _NAMES.get(key, f"--{key} {recorded.get(key)!r} (this run: {value!r})")
            raise SwiftError(f"{flag} {folder} was encoded with {what}: export it again with this run's --model and "
                             "template flags")
    if info.get("seed") != seed:
        raise SwiftError(f"{flag} {folder} was read, shuffled and split with seed {info.get('seed')} (this run's data "
                         f"seed: {seed}): export it again with --seed {seed}")
    train = load_from_disk(os.path.join(folder, "train"))
    val = load_from_disk(os.path.join(folder, "val")) if rows.get("val") else None
    if len(train) != rows.get("train") or (val is not None and len(val) != rows["val"]):
        raise SwiftError(f"{flag} {folder}: its rows are not the ones {INFO} records (written over by another export?)")
    return train, val

from __future__ import annotations

import json
from dataclasses import dataclass, field

from swift.utils.registry import SwiftError


@dataclass
class DataArguments:
    dataset: list[str] = field(default_factory=list, metadata={
        "help": "Training data: 'path_or_id[:subset][#N]', several allowed (mixed). Files: jsonl/json/csv/parquet/txt; "
                "built-ins: builtin:arith-sft, builtin:arith-pt."})
    val_dataset: list[str] = field(default_factory=list, metadata={"help": "Validation data, same spec as --dataset."})
    split_dataset_ratio: float = field(default=0.0, metadata={"help": "Fraction of --dataset held out for validation when --val_dataset is not given."})
    columns: str | None = field(default=None, metadata={"help": "JSON mapping of column renames applied before format detection, e.g. '{\"q\": \"query\"}'."})
    load_from_cache_file: bool = field(default=False, metadata={
        "help": "ms-swift's dataset-cache switch. This version keeps no automatic cache of encoded datasets: every "
                "run encodes its rows (what a cache miss does), so true only logs that; an explicit cache is "
                "`swift export --to_cached_dataset` with --cached_dataset."})
    strict: bool = field(default=False, metadata={"help": "true: a bad row stops the run naming file and row; false: bad rows are dropped and counted."})
    streaming: bool = field(default=False, metadata={"help": "Read and encode data lazily as training consumes it (needs --max_steps)."})
    padding_free: bool = field(default=False, metadata={
        "help": "Each batch becomes one row without padding: its samples side by side, with per-sample position "
                "ids and a block-diagonal causal mask (pt/sft; sdpa or eager attention)."})
    packing: bool = field(default=False, metadata={"help": "Bin-pack samples into rows of --max_length; tokens never attend across samples."})
    dataset_shuffle: bool | None = field(default=None, metadata={
        "help": "Shuffle the mixed dataset once after loading, with --data_seed (default: true; --streaming reads "
                "rows in order, so false there)."})
    model_name: list[str] = field(default_factory=list, metadata={
        "help": "Fills {{NAME}} in the rows (e.g. builtin:self-cognition): one value, or the Chinese and English form."})
    model_author: list[str] = field(default_factory=list, metadata={
        "help": "Fills {{AUTHOR}} in the rows: one value, or the Chinese and English form."})
    lazy_tokenize: bool = field(default=False, metadata={
        "help": "Encode each row when training reaches it instead of all rows up front (not with --packing)."})
    dataset_num_proc: int = field(default=1, metadata={
        "help": "Processes that encode (tokenize) the rows; the result is the same as with 1."})
    cached_dataset: list[str] = field(default_factory=list, metadata={
        "help": "Folders written by `swift export --to_cached_dataset`: their rows, encoded already, train (and "
                "their val rows validate) instead of --dataset (sft/pt)."})

    def __post_init__(self) -> None:
        for flag in ("model_name", "model_author"):
            if isinstance(getattr(self, flag), str):
                setattr(self, flag, [getattr(self, flag)])
            if len(getattr(self, flag)) > 2:
                raise SwiftError(f"--{flag} takes one value, or two (the Chinese and the English form)")
        if self.dataset_num_proc < 1:
            raise SwiftError(f"--dataset_num_proc must be at least 1, got {self.dataset_num_proc}")
        if not 0.0 <= self.split_dataset_ratio < 1.0:
            raise SwiftError(f"--split_dataset_ratio must be in [0, 1), got {self.split_dataset_ratio}")
        if isinstance(self.dataset, str):
            self.dataset = [self.dataset]
        if isinstance(self.val_dataset, str):
            self.val_dataset = [self.val_dataset]
        if self.lazy_tokenize and (self.packing or self.streaming):
            raise SwiftError("--lazy_tokenize encodes rows as training reaches them; --packing needs every row "
                             "encoded up front and --streaming is lazy already")
        if self.streaming and self.packing:
            raise SwiftError("--packing needs the whole dataset up front; it cannot be combined with --streaming")
        if self.val_dataset and self.split_dataset_ratio > 0:
            raise SwiftError("--val_dataset is the validation data; --split_dataset_ratio would hold out rows that "
                             "nothing validates on: give one")
        if self.streaming and self.split_dataset_ratio > 0:
            raise SwiftError("--streaming reads rows in order and holds none out: give --val_dataset instead of "
                             "--split_dataset_ratio")
        if self.streaming and self.dataset_shuffle:  # (ms-swift shuffles a stream in a buffer; here it is not)
            raise SwiftError("--dataset_shuffle true: --streaming reads rows in the files' order and shuffles none "
                             "(#N takes the first N rows); leave it out, or drop --streaming")
        self.dataset_shuffle = not self.streaming if self.dataset_shuffle is None else self.dataset_shuffle
        if (self.streaming or self.lazy_tokenize) and self.dataset_num_proc != 1:
            raise SwiftError(f"--dataset_num_proc encodes rows up front; with --{'streaming' if self.streaming else 'lazy_tokenize'} "
                             "rows are encoded as training reaches them")
        self.column_map  # validate early
        if isinstance(self.cached_dataset, str):
            self.cached_dataset = [self.cached_dataset]
        if self.cached_dataset:
            self._check_cached()
        from swift.dataset.loader import DatasetSpec  # (the loader imports the templates: not at import time)

        for spec in self.dataset + self.val_dataset:  # a bad `#N` is refused here; the files are checked by
            DatasetSpec.parse(spec)                   # `check_specs`, before the model loads

    def _check_cached(self) -> None:
        """Flags that decide how rows are read and encoded were applied by the export already."""
        read = [f for f in ("dataset", "val_dataset", "model_name", "model_author", "columns") if getattr(self, f)]
        read += [f for f, default in (("split_dataset_ratio", 0.0), ("dataset_num_proc", 1), ("strict", False))
                 if getattr(self, f) != default]
        if read:
            raise SwiftError(f"--{read[0]} reads or encodes rows; with --cached_dataset the rows are encoded already "
                             "(pass it to `swift export --to_cached_dataset` instead)")
        lazy = [f for f, default in (("streaming", False), ("lazy_tokenize", False)) if getattr(self, f) != default]
        lazy += ["dataset_shuffle"] if self.dataset_shuffle is False else []
        if lazy:
            raise SwiftError(f"--{lazy[0]} is about reading rows; a --cached_dataset is read, shuffled (with its seed) "
                             "and encoded already")

    @property
    def column_map(self) -> dict[str, str]:
        if not self.columns:
            return {}
        if isinstance(self.columns, dict):
            return self.columns
        try:
            mapping = json.loads(self.columns)
        except json.JSONDecodeError as e:
            raise SwiftError(f"--columns must be a JSON object like '{{\"old\": \"new\"}}': {e}") from None
        if not isinstance(mapping, dict):
            raise SwiftError("--columns must be a JSON object like '{\"old\": \"new\"}'")
        return mapping

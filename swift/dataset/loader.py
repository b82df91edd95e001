"""Dataset specs → standard rows, with bad-row accounting.

A spec is `path_or_id[:subset][#N]`: a local file (jsonl, json, csv, parquet, txt), a hub dataset
id (ModelScope by default, HF with --use_hf), `builtin:<name>[:train|eval]`, or a reasoning-gym task
`reasoning_gym:<task>[?config][:train|eval]` (swift/dataset/reasoning_gym.py). `#N` takes N rows:
a random sample when N is smaller than the dataset, whole repeats plus a sample when larger.
"""
from __future__ import annotations

import csv
import json
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from swift.dataset import self_cognition, tool_calls, toy_safety  # noqa: F401  (register builtin:self-cognition, tool-calls, toy-safety-*)
from swift.dataset.arith import BUILTIN_DATASETS, SPLITS
from swift.dataset.preprocess import standardize
from swift.model.hub import snapshot_download
from swift.template.base import RowError
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)
FILE_TYPES = (".jsonl", ".json", ".csv", ".parquet", ".txt")


@dataclass
class DatasetSpec:
    source: str
    subset: str | None = None
    n: int | None = None

    @classmethod
    def parse(cls, spec: str) -> "DatasetSpec":
        source, n = spec, None
        if "#" in spec:
            source, _, count = spec.rpartition("#")
            if not count.isdigit() or int(count) == 0:
                raise SwiftError(f"dataset spec '{spec}': the part after '#' must be a positive row count")
            n = int(count)
        prefix = next((p for p in ("builtin:", "reasoning_gym:", "verifiers:") if source.startswith(p)), "")
        rest = source[len(prefix):]
        subset = None
        # after a generated dataset's query (`?...`), a ':' is the query's (a URL) unless a split follows it
        if not os.path.exists(rest) and ":" in rest and (prefix in ("", "builtin:") or "?" not in rest
                                                         or rest.rpartition(":")[2] in SPLITS):
            rest, _, subset = rest.rpartition(":")
        return cls(prefix + rest, subset or None, n)


@dataclass
class RowSet:
    """Rows plus where each came from (`file row N`), and why rows were dropped."""

    rows: list[dict] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)
    first_bad: dict[str, str] = field(default_factory=dict)
    seen: int = 0  # rows read from the files, good and bad (a `#N` sample may repeat or leave out some)

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: dict, origin: str) -> None:
        self.rows.append(row)
        self.origins.append(origin)

    def extend(self, other: "RowSet") -> None:
        self.rows += other.rows
        self.origins += other.origins
        self.seen += other.seen
        self.dropped.update(other.dropped)
        for k, v in other.first_bad.items():
            self.first_bad.setdefault(k, v)

    def reject(self, origin: str, error: Exception, strict: bool) -> None:
        if strict:
            raise SwiftError(f"{origin}: {error} (fix the row, or run with --strict false to drop bad rows)")
        self.dropped[str(error)] += 1
        self.first_bad.setdefault(str(error), origin)

    def report(self, what: str) -> str | None:
        """Log (and return) one line saying how many rows were dropped and why."""
        total = sum(self.dropped.values())
        if not total:
            return None
        reasons = "; ".join(f"{n} × {reason} (first: {self.first_bad[reason]})"
                            for reason, n in self.dropped.most_common())
        line = f"{what}: dropped {total} of {self.seen or total + len(self.rows)} rows read: {reasons}"
        logger.warning(line)
        return line


# -- raw readers -------------------------------------------------------------------------------
def iter_file(path: str) -> Iterator[tuple[int, Any]]:
    """Yield (row_number, raw_row) from a local file; row numbers are 1-based lines or items. A file
    that cannot be read as its type (not UTF-8, not parquet) stops the run in one line naming it."""
    try:
        yield from _read_file(path)
    except UnicodeDecodeError as e:
        raise SwiftError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from None
    except csv.Error as e:
        raise SwiftError(f"{path}: not a readable CSV file ({e})") from None
    except OSError as e:
        raise SwiftError(f"{path}: cannot be read ({e.strerror or e})") from None
    except ValueError as e:  # pyarrow's ArrowInvalid: not a parquet file
        if Path(path).suffix.lower() != ".parquet":
            raise
        raise SwiftError(f"{path}: not a readable parquet file ({str(e).splitlines()[0]})") from None


def _read_file(path: str) -> Iterator[tuple[int, Any]]:
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".txt"):  # read by line: a line that is not UTF-8 is that row's error
        with open(path, "rb") as f:
            for i, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    yield i, RowError(f"not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1})")
                    continue
                if not line.strip():
                    continue
                if suffix == ".txt":
                    yield i, {"text": line.rstrip("\r\n")}
                    continue
                try:
                    yield i, json.loads(line)
                except json.JSONDecodeError as e:
                    yield i, RowError(f"invalid JSON ({e.msg} at column {e.colno})")
    elif suffix == ".json":
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise SwiftError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
        if isinstance(data, dict):  # {"data": [...]} or a single row
            data = next((v for v in data.values() if isinstance(v, list)), [data])
        yield from enumerate(data, 1)
    elif suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            for i, row in enumerate(csv.DictReader(f), 2):  # row 1 is the header
                yield i, row
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from enumerate(pq.read_table(path).to_pylist(), 1)
    else:
        raise SwiftError(f"dataset file {path}: unsupported type '{suffix}'; use one of {', '.join(FILE_TYPES)}")


def _hub_files(spec: DatasetSpec, use_hf: bool) -> list[str]:
    root = snapshot_download(spec.source, use_hf=use_hf, repo_type="dataset")
    files = sorted(str(p) for p in Path(root).rglob("*") if p.suffix.lower() in FILE_TYPES and ".git" not in p.parts)
    if spec.subset:
        files = [f for f in files if spec.subset in Path(f).relative_to(root).parts or spec.subset in Path(f).stem]
    train = [f for f in files if "train" in Path(f).name]
    if not files:
        raise SwiftError(f"dataset '{spec.source}' (subset {spec.subset}) has no data files")
    return train or files


def iter_raw(spec: DatasetSpec, use_hf: bool = False, flag: str = "--dataset") -> Iterator[tuple[str, Any]]:
    """Yield (origin, raw_row) for a spec, in file order."""
    generated = next((p for p in ("builtin:", "reasoning_gym:", "verifiers:") if spec.source.startswith(p)), None)
    if generated:  # rows made by code (built-in, a reasoning-gym task, a verifiers environment), by split
        split = spec.subset or "train"
        if split not in SPLITS:
            raise SwiftError(f"dataset '{spec.source}': subset '{split}' is not one of {', '.join(SPLITS)}")
        if generated == "builtin:":
            for i, row in enumerate(BUILTIN_DATASETS.get(spec.source[len(generated):])(split), 1):
                yield f"{spec.source}:{split} row {i}", row
        elif generated == "reasoning_gym:":
            from swift.dataset import reasoning_gym

            yield from reasoning_gym.iter_rows(spec.source, split, spec.n)
        else:
            from swift.rollout import verifiers_env

            yield from verifiers_env.iter_rows(spec.source, split, spec.n)
        return
    if os.path.isfile(spec.source):
        files = [spec.source]
    elif os.path.isdir(spec.source):
        files = sorted(str(p) for p in Path(spec.source).rglob("*") if p.suffix.lower() in FILE_TYPES)
    elif os.path.exists(spec.source) or spec.source.endswith(FILE_TYPES) or spec.source.count("/") != 1:
        raise SwiftError(f"{flag} {spec.source}: no such file")
    else:
        files = _hub_files(spec, use_hf)
    for path in files:
        for i, row in iter_file(path):
            yield f"{path} row {i}", row


def standard_rows(spec: DatasetSpec, *, column_map: dict, strict: bool, use_hf: bool = False,
                  flag: str = "--dataset") -> Iterator[tuple[str, Any]]:
    """Yield (origin, standard row or RowError)."""
    for origin, raw in iter_raw(spec, use_hf, flag):
        if isinstance(raw, RowError):
            yield origin, raw
            continue
        if not isinstance(raw, dict):
            yield origin, RowError(f"row is {type(raw).__name__}, expected an object")
            continue
        try:
            yield origin, standardize(raw, column_map)
        except RowError as e:
            yield origin, e


def _take(rowset: RowSet, n: int, rng: random.Random) -> RowSet:
    """N rows: whole repeats of the data, then a random sample of the remainder."""
    if not rowset.rows:
        return rowset
    reps, rem = divmod(n, len(rowset.rows))
    idx = list(range(len(rowset.rows))) * reps + sorted(rng.sample(range(len(rowset.rows)), rem))
    out = RowSet(dropped=rowset.dropped, first_bad=rowset.first_bad, seen=rowset.seen)
    for i in idx:
        out.add(rowset.rows[i], rowset.origins[i])
    return out


def load_rows(specs: list[str], *, column_map: dict | None = None, strict: bool = False, seed: int = 42,
              use_hf: bool = False, shuffle: bool = False, flag: str = "--dataset") -> RowSet:
    """Load and mix several dataset specs into one RowSet of standard rows (`flag` names them in errors)."""
    rng = random.Random(seed)
    mixed = RowSet()
    for text in specs:
        spec = DatasetSpec.parse(text)
        part = RowSet()
        for origin, row in standard_rows(spec, column_map=column_map or {}, strict=strict, use_hf=use_hf, flag=flag):
            part.seen += 1
            if isinstance(row, RowError):
                part.reject(origin, row, strict)
            else:
                part.add(row, origin)
        if not part.rows:
            raise SwiftError(f"{flag} {text}: no usable rows" + (f" ({part.dropped.most_common(1)[0][0]})" if part.dropped else ""))
        if spec.n is not None:
            part = _take(part, spec.n, rng)
        mixed.extend(part)
    if shuffle:
        order = list(range(len(mixed.rows)))
        rng.shuffle(order)
        mixed.rows = [mixed.rows[i] for i in order]
        mixed.origins = [mixed.origins[i] for i in order]
    return mixed


def split_rows(rowset: RowSet, ratio: float, seed: int) -> tuple[RowSet, RowSet]:
    """Hold out `ratio` of the rows (at least one) for validation."""
    order = list(range(len(rowset.rows)))
    random.Random(seed).shuffle(order)
    n_val = max(1, int(round(len(order) * ratio)))
    train, val = RowSet(dropped=rowset.dropped, first_bad=rowset.first_bad, seen=rowset.seen), RowSet()
    for k, i in enumerate(order):
        (val if k < n_val else train).add(rowset.rows[i], rowset.origins[i])
    return train, val


def read_rows(data_args, seed: int, use_hf: bool) -> tuple[RowSet, RowSet]:
    """The training and validation rows of --dataset / --val_dataset / --split_dataset_ratio, shuffled,
    split and filled ({{NAME}}, {{AUTHOR}}) as training reads them (`swift export --to_cached_dataset` too)."""
    d = data_args
    load = dict(column_map=d.column_map, strict=d.strict, seed=seed, use_hf=use_hf)
    train_rows = load_rows(d.dataset, shuffle=d.dataset_shuffle, **load)
    if d.val_dataset:
        val_rows = load_rows(d.val_dataset, flag="--val_dataset", **load)
    elif d.split_dataset_ratio > 0:
        train_rows, val_rows = split_rows(train_rows, d.split_dataset_ratio, seed)
    else:
        val_rows = RowSet()
    for rows in (train_rows, val_rows):
        self_cognition.fill_identity(rows.rows, d.model_name, d.model_author)
    return train_rows, val_rows

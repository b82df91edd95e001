"""Dataset specs → standard rows, with bad-row accounting.

A spec is `path_or_id[:subset][#N]`: a local file (jsonl, json, csv, parquet, txt), a hub dataset
id (ModelScope by default, HF with --use_hf), `builtin:<name>[:train|eval]`, or a reasoning-gym task
`reasoning_gym:<task>[?config][:train|eval]` (swift/dataset/reasoning_gym.py). `#N` takes N rows:
a random sample when N is smaller than the dataset, whole repeats plus a sample when larger; with
--split_dataset_ratio the validation rows are held out first and the N include them (ms-swift's order).
"""
from __future__ import annotations

import csv
import json
import os
import random
import re
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
DATA_SEED = 42  # --data_seed's default (ms-swift's): which rows are sampled, held out and in what order
FILE_TYPES = (".jsonl", ".json", ".csv", ".parquet", ".txt")
HUB_DATA_TYPES = (".jsonl", ".json", ".csv", ".parquet")
HUB_METADATA = {"dataset_infos.json", "dataset_info.json", "dataset_dict.json", "state.json", "configuration.json"}
NOT_TEXT_DATA = ("LICENSE", "LICENCE", "README", "NOTICE", "COPYING", "CITATION", "REQUIREMENTS")
SPLIT_DIRS = {"train", "test", "validation", "valid", "val", "dev", "eval"}
TRAIN_FILE = re.compile(r"(^|[^a-z])train")  # train-0000.parquet, data/train/x.jsonl, training.json; not constraint


@dataclass
class DatasetSpec:
    source: str
    subset: str | None = None
    n: int | None = None

    @classmethod
    def parse(cls, spec: str) -> "DatasetSpec":
        source, n = spec, None
        if "#" in spec and not os.path.exists(spec):  # a file named v#2.jsonl is that file
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
    if suffix == ".json" and _json_lines(path):  # HF's json loader reads JSON lines under .json too
        suffix = ".jsonl"
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
        if isinstance(data, dict):  # {"data": [rows...]} or a single row
            data = next((v for v in data.values() if _is_row_list(v)), [data])
        yield from enumerate(data, 1)
    elif suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            for i, row in enumerate(csv.DictReader(f), 2):  # row 1 is the header
                # an empty cell is a missing value, as HF's csv loader reads it (before 2026-12-07 an
                # empty `system` cell was an empty system turn)
                yield i, {k: (None if v == "" else v) for k, v in row.items()}
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from enumerate(pq.read_table(path).to_pylist(), 1)
    else:
        raise SwiftError(f"dataset file {path}: unsupported type '{suffix}'; use one of {', '.join(FILE_TYPES)}")


def _json_lines(path: str) -> bool:
    """Whether a .json file holds one JSON value a line (its first line a whole object)."""
    with open(path, "rb") as f:
        if f.read(1) != b"{":  # (an array is one JSON value: its line is not read twice)
            return False
        first = b"{" + f.readline().strip()
        rest = f.read(1)
    if not rest:
        return False
    try:
        return isinstance(json.loads(first), dict)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def _is_row_list(value: Any) -> bool:
    """A list of rows (objects that are not messages): the rows of a `{"data": [...]}` file. A
    single row's `{"messages": [...]}` is one row (before 2026-12-07 its messages were read as rows)."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, dict) and not {"role", "from"} & v.keys() for v in value)


def _hub_files(spec: DatasetSpec, use_hf: bool) -> list[str]:
    """The data files of a hub dataset: those of `:subset` (a folder or file name), its train files
    where it names some. Only data types are read: no LICENSE.txt or dataset_infos.json (a .txt file
    only in a text dataset, one with no other data). A dataset whose files lie in several subset
    folders and no `:subset` is refused, naming them (before 2026-12-07 the subsets were mixed, and
    `:subset` matched any part of a file name)."""
    root = Path(snapshot_download(spec.source, use_hf=use_hf, repo_type="dataset"))
    found = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    found = [p for p in found if not any(part.startswith(".") for part in p.parts)]
    files = [p for p in found if p.suffix.lower() in HUB_DATA_TYPES and p.name.lower() not in HUB_METADATA]
    if not files:  # a text dataset
        files = [p for p in found if p.suffix.lower() == ".txt" and not p.stem.upper().startswith(NOT_TEXT_DATA)]
    subsets = _subsets(files)
    if spec.subset:
        files = [p for p in files if spec.subset in p.parts[:-1] or p.stem == spec.subset]
    elif len(subsets) > 1:
        raise SwiftError(f"dataset '{spec.source}' has several subsets ({', '.join(subsets)}): give one, e.g. "
                         f"'{spec.source}:{subsets[0]}'")
    if not files:
        known = f" (its subsets: {', '.join(subsets)})" if subsets else ""
        raise SwiftError(f"dataset '{spec.source}'{f' subset {spec.subset!r}' if spec.subset else ''} has no data "
                         f"files{known}")
    train = [p for p in files if TRAIN_FILE.search(str(p).lower())]
    return [str(root / p) for p in train or files]


def _subsets(files: list[Path]) -> list[str]:
    """The folders that hold a hub dataset's subsets: where the files' folders first differ (a split
    folder, train/ or test/, is not a subset)."""
    dirs = [p.parts[:-1] for p in files]
    depth = 0
    while dirs and all(len(d) > depth for d in dirs) and len({d[depth] for d in dirs}) == 1:
        depth += 1
    return sorted({d[depth] for d in dirs if len(d) > depth and d[depth].lower() not in SPLIT_DIRS})


def _local(spec: DatasetSpec, flag: str) -> list[str] | None:
    """A local spec's files, None for a hub id; a path that looks local and is not there is refused."""
    if os.path.isfile(spec.source):
        return [spec.source]
    if os.path.isdir(spec.source):
        return sorted(str(p) for p in Path(spec.source).rglob("*") if p.suffix.lower() in FILE_TYPES)
    if os.path.exists(spec.source) or spec.source.endswith(FILE_TYPES) or spec.source.count("/") != 1:
        raise SwiftError(f"{flag} {spec.source}: no such file")
    return None


def check_specs(specs: list[str], flag: str = "--dataset") -> None:
    """Parse every spec, and check its local file or built-in name: training calls it before the
    model loads (before 2026-12-07 a missing file stopped the run after the model had loaded)."""
    for text in specs:
        spec = DatasetSpec.parse(text)
        if spec.source.startswith("builtin:"):
            BUILTIN_DATASETS.get(spec.source[len("builtin:"):])
            if (spec.subset or "train") not in SPLITS:
                raise SwiftError(f"{flag} {text}: subset '{spec.subset}' is not one of {', '.join(SPLITS)}")
        elif not spec.source.startswith(("reasoning_gym:", "verifiers:")):
            _local(spec, flag)


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
    files = _local(spec, flag)
    if files is None:
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
    return load_split(specs, 0.0, column_map=column_map, strict=strict, seed=seed, use_hf=use_hf, shuffle=shuffle,
                      flag=flag)[0]


def load_split(specs: list[str], ratio: float, *, column_map: dict | None = None, strict: bool = False,
               seed: int = 42, use_hf: bool = False, shuffle: bool = False,
               flag: str = "--dataset") -> tuple[RowSet, RowSet]:
    """(training rows, validation rows): `ratio` of each dataset's rows (at least one) held out before
    its `#N` sample is taken from the rest, as ms-swift does, so the two never share a row (before
    2026-12-07 the sample came first, and with N over the dataset's size its repeats were split)."""
    rng = random.Random(seed)
    train, val = RowSet(), RowSet()
    for text in specs:
        spec = DatasetSpec.parse(text)
        part = _read(text, spec, column_map=column_map or {}, strict=strict, use_hf=use_hf, flag=flag)
        n = spec.n
        if ratio > 0:
            held, part = _hold_out(part, ratio, n, rng, f"{flag} {text}")
            val.extend(held)
            n = None if n is None else n - len(held)  # ms-swift: the N rows are train and val together
        if n is not None:
            part = _take(part, n, rng)
        train.extend(part)
    if shuffle:
        order = list(range(len(train.rows)))
        rng.shuffle(order)
        train.rows = [train.rows[i] for i in order]
        train.origins = [train.origins[i] for i in order]
    return train, val


def _read(text: str, spec: DatasetSpec, *, column_map: dict, strict: bool, use_hf: bool, flag: str) -> RowSet:
    part = RowSet()
    for origin, row in standard_rows(spec, column_map=column_map, strict=strict, use_hf=use_hf, flag=flag):
        part.seen += 1
        if isinstance(row, RowError):
            part.reject(origin, row, strict)
        else:
            part.add(row, origin)
    if not part.rows:
        raise SwiftError(f"{flag} {text}: no usable rows" + (f" ({part.dropped.most_common(1)[0][0]})" if part.dropped else ""))
    return part


def _hold_out(rowset: RowSet, ratio: float, n: int | None, rng: random.Random, what: str) -> tuple[RowSet, RowSet]:
    """(held-out rows, the rest): `ratio` of the dataset's rows, or of its `#N` when that is fewer."""
    order = list(range(len(rowset.rows)))
    rng.shuffle(order)
    size = min(len(order), n or len(order))
    n_val = max(1, int(round(size * ratio)))
    if n_val >= size:
        raise SwiftError(f"{what}: --split_dataset_ratio {ratio} holds out {n_val} of its {size} rows, leaving none "
                         "to train on")
    val, train = RowSet(), RowSet(dropped=rowset.dropped, first_bad=rowset.first_bad, seen=rowset.seen)
    for k, i in enumerate(order):
        (val if k < n_val else train).add(rowset.rows[i], rowset.origins[i])
    return val, train


def read_rows(data_args, seed: int, use_hf: bool) -> tuple[RowSet, RowSet]:
    """The training and validation rows of --dataset / --val_dataset / --split_dataset_ratio, shuffled,
    split and filled ({{NAME}}, {{AUTHOR}}) as training reads them (`swift export --to_cached_dataset` too)."""
    d = data_args
    load = dict(column_map=d.column_map, strict=d.strict, seed=seed, use_hf=use_hf)
    train_rows, val_rows = load_split(d.dataset, d.split_dataset_ratio, shuffle=d.dataset_shuffle, **load)
    if d.val_dataset:
        val_rows = load_rows(d.val_dataset, flag="--val_dataset", **load)
    for rows in (train_rows, val_rows):
        self_cognition.fill_identity(rows.rows, d.model_name, d.model_author)
    return train_rows, val_rows

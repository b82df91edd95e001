"""Standard rows → encoded samples → (optionally) packed rows → padded batches."""
from __future__ import annotations

import itertools
import random
from concurrent.futures import ProcessPoolExecutor
from typing import Iterator

import torch
from torch.utils.data import Dataset, IterableDataset
from tqdm import tqdm

from swift.dataset.loader import DatasetSpec, RowSet, standard_rows
from swift.template.base import IGNORE_INDEX, RowError, Template
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)


def encode_rows(rowset: RowSet, encode, *, strict: bool, desc: str = "encode", num_proc: int = 1) -> list[dict]:
    """`encode(row)` for every row (a Template encodes conversations for training); rows that cannot
    be encoded are dropped and counted (or raise with strict). With `num_proc` > 1 the rows are
    encoded by that many forked processes, in order: the result is the same as with one."""
    if isinstance(encode, Template):
        encode = _TemplateEncode(encode)
    bar = tqdm(total=len(rowset), desc=desc, leave=False, mininterval=1)
    samples, kept = [], []
    for i, ((ok, value), origin) in enumerate(zip(_encoded(rowset.rows, encode, num_proc, bar), rowset.origins)):
        if ok:
            samples.append(value)
            kept.append(i)
        else:
            rowset.reject(origin, RowError(value), strict)
    bar.close()
    if len(kept) < len(rowset.rows):  # the row set holds what was kept, so its report counts right
        rowset.rows = [rowset.rows[i] for i in kept]
        rowset.origins = [rowset.origins[i] for i in kept]
    return samples


class _TemplateEncode:
    def __init__(self, template: Template):
        self.template = template

    def __call__(self, row: dict) -> dict:
        enc = self.template.encode(row)
        return {"input_ids": enc.input_ids, "labels": enc.labels}


_WORK: tuple | None = None  # (encode, rows), inherited by forked encoding workers


def _encode_slice(bounds: tuple[int, int]) -> list[tuple[bool, object]]:
    encode, rows = _WORK
    out = []
    for i in range(*bounds):
        try:
            out.append((True, encode(rows[i])))
        except RowError as e:
            out.append((False, str(e)))
    return out


def _encoded(rows: list[dict], encode, num_proc: int, bar) -> Iterator[tuple[bool, object]]:
    global _WORK
    import multiprocessing

    if num_proc <= 1 or len(rows) < 2 * num_proc or "fork" not in multiprocessing.get_all_start_methods():
        _WORK = (encode, rows)
        try:
            for i in range(len(rows)):
                yield from _encode_slice((i, i + 1))
                bar.update()
        finally:
            _WORK = None
        return
    size = max(1, min(1000, len(rows) // (4 * num_proc)))
    chunks = [(s, min(s + size, len(rows))) for s in range(0, len(rows), size)]
    _WORK = (encode, rows)
    try:  # an executor, not a Pool: a worker that dies (e.g. out of memory) raises instead of hanging
        with ProcessPoolExecutor(num_proc, mp_context=multiprocessing.get_context("fork")) as pool:
            for part in pool.map(_encode_slice, chunks):
                bar.update(len(part))
                yield from part
    finally:
        _WORK = None


class LazyDataset(Dataset):
    """Rows encoded when the trainer asks for them (`--lazy_tokenize`): nothing is tokenized up
    front. A row that cannot be encoded stops the run with strict; otherwise it is reported once and
    the next encodable row takes its place (as ms-swift does, which picks another row)."""

    def __init__(self, rowset: RowSet, encode, *, strict: bool):
        self.rows, self.origins = rowset.rows, rowset.origins
        self.encode = _TemplateEncode(encode) if isinstance(encode, Template) else encode
        self.strict = strict
        self._bad: set[int] = set()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        for k in range(len(self.rows)):
            j = (i + k) % len(self.rows)
            if j in self._bad:
                continue
            try:
                return self.encode(self.rows[j])
            except RowError as e:
                if self.strict:
                    raise SwiftError(f"{self.origins[j]}: {e} (fix the row, or run with --strict false to skip "
                                     "bad rows)") from None
                self._bad.add(j)
                logger.warning(f"{self.origins[j]}: {e} (row skipped; the next row takes its place)")
        raise SwiftError("no row of the dataset can be encoded")


class ListDataset(Dataset):
    def __init__(self, items: list[dict]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def pack(samples: list[dict], max_length: int, seed: int = 42) -> list[dict]:
    """First-fit-decreasing bin packing of samples into rows of at most `max_length` tokens.

    Each packed row keeps its samples' lengths (`seq_lens`); the collator turns them into a
    block-diagonal causal mask and per-sample position ids, so no token sees another sample.
    """
    order = sorted(range(len(samples)), key=lambda i: -len(samples[i]["input_ids"]))
    bins: list[list[int]] = []
    space: list[int] = []
    for i in order:
        n = len(samples[i]["input_ids"])
        for b, free in enumerate(space):
            if n <= free:
                bins[b].append(i)
                space[b] -= n
                break
        else:
            bins.append([i])
            space.append(max_length - n)
    random.Random(seed).shuffle(bins)
    return [join([samples[i] for i in b]) for b in bins]


def join(samples: list[dict]) -> dict:
    """Samples side by side in one row that keeps their lengths (`seq_lens`); the first token of a
    sample is never predicted from the previous sample."""
    ids, labels, lens = [], [], []
    for s in samples:
        ids += s["input_ids"]
        labels += [IGNORE_INDEX] + s["labels"][1:]
        lens.append(len(s["input_ids"]))
    return {"input_ids": ids, "labels": labels, "seq_lens": lens}


class StreamingDataset(IterableDataset):
    """Reads, standardizes and encodes rows as training consumes them, cycling forever."""

    def __init__(self, specs: list[str], template: Template, *, column_map: dict, strict: bool, use_hf: bool = False,
                 prepare=None):
        """`prepare(row)`: applied to each standardized row before encoding (e.g. filling identity
        placeholders)."""
        self.specs = [DatasetSpec.parse(s) for s in specs]
        self.template, self.column_map, self.strict, self.use_hf = template, column_map, strict, use_hf
        self.prepare = prepare

    def _samples(self, spec: DatasetSpec) -> Iterator[dict]:
        rowset = RowSet()
        rows = standard_rows(spec, column_map=self.column_map, strict=self.strict, use_hf=self.use_hf)
        for origin, row in itertools.islice(rows, spec.n):
            try:
                if isinstance(row, RowError):
                    raise row
                if self.prepare is not None:
                    self.prepare(row)
                enc = self.template.encode(row)
            except RowError as e:
                rowset.reject(origin, e, self.strict)
                logger.warning(f"{origin}: dropped ({e})")
                continue
            yield {"input_ids": enc.input_ids, "labels": enc.labels}

    def _cycle(self, spec: DatasetSpec) -> Iterator[dict]:
        while True:
            n = 0
            for sample in self._samples(spec):
                n += 1
                yield sample
            if n == 0:
                raise SwiftError(f"dataset '{spec.source}' has no usable rows")

    def __iter__(self) -> Iterator[dict]:
        streams = [self._cycle(spec) for spec in self.specs]
        for stream in itertools.cycle(streams):  # interleave the datasets one sample at a time
            yield next(stream)


class Collator:
    """Right-pads a batch; packed rows also get position ids and a 4D block-diagonal causal mask."""

    def __init__(self, pad_token_id: int, dtype: torch.dtype = torch.float32):
        self.pad_token_id = pad_token_id
        self.dtype = dtype

    def __call__(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        length = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), length), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(batch), length), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(batch), length), dtype=torch.long)
        for i, b in enumerate(batch):
            n = len(b["input_ids"])
            ids[i, :n] = torch.tensor(b["input_ids"])
            labels[i, :n] = torch.tensor(b["labels"])
            mask[i, :n] = 1
        out = {"input_ids": ids, "labels": labels, "attention_mask": mask}
        if "seq_lens" in batch[0]:
            out.update(self._packed(batch, length))
        return out

    def _packed(self, batch: list[dict], length: int) -> dict[str, torch.Tensor]:
        segment = torch.empty((len(batch), length), dtype=torch.long)
        position = torch.empty((len(batch), length), dtype=torch.long)
        for i, b in enumerate(batch):
            lens = list(b["seq_lens"])
            pad = length - sum(lens)
            if pad:
                lens.append(pad)  # padding is its own segment, so no row of the mask is empty
            segment[i] = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
            position[i] = torch.cat([torch.arange(n) for n in lens])
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        allowed = (segment[:, :, None] == segment[:, None, :]) & causal
        additive = torch.zeros(allowed.shape, dtype=self.dtype).masked_fill(~allowed, torch.finfo(self.dtype).min)
        return {"attention_mask": additive[:, None], "position_ids": position}


class PaddingFreeCollator(Collator):
    """`--padding_free`: each batch becomes one row of its samples side by side (no padding), with
    per-sample position ids and a block-diagonal causal mask; rows already packed pass through."""

    def __call__(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        return super().__call__(batch if "seq_lens" in batch[0] else [join(batch)])

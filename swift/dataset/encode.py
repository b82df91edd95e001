"""Standard rows → encoded samples → (optionally) packed rows → padded batches."""
from __future__ import annotations

import itertools
import random
from typing import Iterator

import torch
from torch.utils.data import Dataset, IterableDataset
from tqdm import tqdm

from swift.dataset.loader import DatasetSpec, RowSet, standard_rows
from swift.template.base import IGNORE_INDEX, RowError, Template
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)


def encode_rows(rowset: RowSet, template: Template, *, strict: bool, desc: str = "encode") -> list[dict]:
    """Encode every row; rows that cannot be encoded are dropped and counted (or raise with strict)."""
    samples = []
    for row, origin in tqdm(zip(rowset.rows, rowset.origins), total=len(rowset), desc=desc, leave=False, mininterval=1):
        try:
            enc = template.encode(row)
        except RowError as e:
            rowset.reject(origin, e, strict)
            continue
        samples.append({"input_ids": enc.input_ids, "labels": enc.labels})
    return samples


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
    packed = []
    for b in bins:
        ids, labels, lens = [], [], []
        for i in b:
            s = samples[i]
            ids += s["input_ids"]
            # The first token of a sample is never predicted from the previous sample.
            labels += [IGNORE_INDEX] + s["labels"][1:]
            lens.append(len(s["input_ids"]))
        packed.append({"input_ids": ids, "labels": labels, "seq_lens": lens})
    return packed


class StreamingDataset(IterableDataset):
    """Reads, standardizes and encodes rows as training consumes them, cycling forever."""

    def __init__(self, specs: list[str], template: Template, *, column_map: dict, strict: bool, use_hf: bool = False):
        self.specs = [DatasetSpec.parse(s) for s in specs]
        self.template, self.column_map, self.strict, self.use_hf = template, column_map, strict, use_hf

    def _samples(self, spec: DatasetSpec) -> Iterator[dict]:
        rowset = RowSet()
        rows = standard_rows(spec, column_map=self.column_map, strict=self.strict, use_hf=self.use_hf)
        for origin, row in itertools.islice(rows, spec.n):
            try:
                if isinstance(row, RowError):
                    raise row
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

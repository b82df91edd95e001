"""The weight-sync transport between a trainer and `swift rollout` workers (DESIGN.md §4).

The trainer announces each bucket over HTTP (`/update_flattened_params/`: names, shapes, dtypes and
offsets into one flat tensor), broadcasts the flat tensor over a torch.distributed group in which
it is the last rank (gloo on CPU, NCCL on GPU), and then every rank all-gathers one checksum per
bucket: the workers' is computed from the weights their engine holds after loading. A mismatch or
a timeout raises; nothing waits forever.

The group is a process group object of its own (not `init_process_group`), so a trainer that is
itself distributed keeps its default group untouched.
"""
from __future__ import annotations

import datetime
import math

import torch
import torch.distributed as dist

from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)

DTYPES = {name: getattr(torch, name) for name in ("float32", "float16", "bfloat16", "float64")}


def parse_dtype(name: str) -> torch.dtype:
    """'torch.float32' or 'float32' → torch.float32; only floating-point weights travel."""
    dtype = DTYPES.get(str(name).removeprefix("torch."))
    if dtype is None:
        raise ValueError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
    return dtype


def plan_buckets(named: list[tuple[str, torch.Tensor]], bucket_mb: float) -> list[list[dict]]:
    """Split tensors into buckets of one dtype and at most `bucket_mb` MiB (a larger tensor gets a
    bucket of its own); each entry is `{name, shape, dtype, start_idx, end_idx, numel}`."""
    limit = max(int(bucket_mb * 2 ** 20), 1)
    buckets: list[list[dict]] = []
    current: list[dict] = []
    size = 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        dtype = str(t.dtype)
        if current and (current[0]["dtype"] != dtype or size + nbytes > limit):
            buckets.append(current)
            current, size = [], 0
        start = current[-1]["end_idx"] if current else 0
        current.append({"name": name, "shape": list(t.shape), "dtype": dtype, "start_idx": start,
                        "end_idx": start + t.numel(), "numel": t.numel()})
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


class NothingLoaded(RuntimeError):
    """A bucket that failed before any of it reached the engine (no group, a broadcast that failed)."""


def validate_metadata(metadatas: list[dict], shapes: dict[str, list[int]]) -> torch.dtype:
    """Check an announced bucket against the engine's parameters; return its dtype. Raises
    ValueError naming the first bad entry (the server answers it with 400)."""
    if not metadatas:
        raise ValueError("metadatas is empty")
    dtype, end, seen = None, 0, set()
    for i, m in enumerate(metadatas):
        for key in ("name", "shape", "dtype", "start_idx", "end_idx"):
            if key not in m:
                raise ValueError(f"metadatas[{i}] has no {key}")
        name, shape = m["name"], m["shape"]
        for key in ("start_idx", "end_idx", "numel"):
            if key in m and (isinstance(m[key], bool) or not isinstance(m[key], int)):
                raise ValueError(f"metadatas[{i}] ({name}): {key} must be an integer")
        if name in seen:
            raise ValueError(f"metadatas[{i}]: {name!r} appears twice in one bucket")
        seen.add(name)
        if name not in shapes:
            raise ValueError(f"metadatas[{i}]: the model has no parameter {name!r}")
        if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise ValueError(f"metadatas[{i}] ({name}): shape must be a list of non-negative ints")
        if list(shape) != list(shapes[name]):
            raise ValueError(f"metadatas[{i}] ({name}): shape {shape} does not match the model's {shapes[name]}")
        this = parse_dtype(m["dtype"])
        if dtype is not None and this != dtype:
            raise ValueError(f"metadatas[{i}] ({name}): a bucket holds one dtype, got {dtype} and {this}")
        dtype = this
        numel = math.prod(shape)
        if m["start_idx"] != end or m["end_idx"] - m["start_idx"] != numel or m.get("numel", numel) != numel:
            raise ValueError(f"metadatas[{i}] ({name}): start_idx/end_idx/numel do not describe {numel} contiguous "
                             f"elements after {end}")
        end = m["end_idx"]
    return dtype


def unflatten(flat: torch.Tensor, metadatas: list[dict]) -> list[tuple[str, torch.Tensor]]:
    return [(m["name"], flat[m["start_idx"]:m["end_idx"]].view(m["shape"])) for m in metadatas]


class WeightGroup:
    """One torch.distributed group between the rollout workers (ranks 0..N-1) and the trainer
    (rank N, which also hosts the rendezvous store)."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float,
                 device: str | torch.device = "cpu"):
        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        trainer = rank == world_size - 1
        try:
            self.store = dist.TCPStore(host, port, world_size, is_master=trainer, timeout=self.timeout,
                                       wait_for_workers=False)
            if self.device.type == "cuda":
                self.pg = dist.ProcessGroupNCCL(self.store, rank, world_size)
            else:
                self.pg = dist.ProcessGroupGloo(self.store, rank, world_size, self.timeout)
        except Exception as e:  # the detail goes to the log; the message may reach an HTTP client
            logger.error(f"weight-sync group at {host}:{port}: {type(e).__name__}: {e}")
            raise SwiftError(f"weight-sync group at {host}:{port} (rank {rank} of {world_size}) could not form "
                             f"within {timeout_s:.0f}s ({type(e).__name__}; see the log)") from None

    def _wait(self, work, what: str) -> None:
        try:
            work.wait(self.timeout)
        except Exception as e:
            raise SwiftError(f"weight sync failed while {what}: {str(e).splitlines()[0]}") from None

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """From the trainer (the last rank) to every worker, in place."""
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = self.world_size - 1, 0
        self._wait(self.pg.broadcast([tensor], opts), "broadcasting a bucket")
        return tensor

    def gather_checksums(self, value: int) -> list[int]:
        """Every rank's checksum, by rank."""
        mine = torch.tensor([value], dtype=torch.int64, device=self.device)
        out = [torch.zeros_like(mine) for _ in range(self.world_size)]
        self._wait(self.pg.allgather([out], [mine]), "collecting checksums")
        return [int(t.item()) for t in out]

    def close(self) -> None:
        self.pg = None
        self.store = None

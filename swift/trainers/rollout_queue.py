"""The online loop's prompt batches, read ahead of training, and the rollout generated in the
background with `--async_generate`.

The HF loop hands the trainer one micro-batch of prompts at a time, but a generation batch spans
`block` micro-batches (and with `--async_generate`, the next generation batch is sampled while this
one trains), so the batches are fetched ahead and numbered in the order training sees them. The
sampler (`RepeatBatchSampler`) repeats each block once per pass over it, so that the HF loop counts
every pass as its own optimizer step(s). The generation batch's size in micro-batches and the
check that the dataset fills one are here too."""
from __future__ import annotations

import concurrent.futures
from collections import deque
from typing import Any, Callable

import torch
from torch.utils.data import Sampler

from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)


class RepeatBatchSampler(Sampler):
    """Shuffled batches of `batch_size` indices per rank, in blocks of `block` batches per rank; each
    block is yielded `repeats` times in a row (accelerate deals whole batches to ranks round-robin,
    so each step's batches for all ranks are interleaved)."""

    def __init__(self, n: int, batch_size: int, repeats: int, world: int, seed: int, block: int = 1):
        self.n, self.batch_size, self.repeats, self.world, self.seed = n, batch_size, repeats, world, seed
        self.block = block
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The HF loop names the epoch (a resumed run starts at its checkpoint's)."""
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        self.epoch += 1
        order = torch.randperm(self.n, generator=g).tolist()
        size = self.batch_size * self.world * self.block
        for start in range(0, self.n - size + 1, size):
            chunk = order[start:start + size]  # step s, rank r: chunk[(s·world + r)·batch_size:][:batch_size]
            for _ in range(self.repeats):
                yield from chunk

    def __len__(self) -> int:
        size = self.batch_size * self.world * self.block
        return (self.n // size) * size * self.repeats


class RolloutQueue:
    """Micro-batches of prompts by sequence number (the order training_step sees them), and at most
    one rollout being generated ahead, keyed by the sequence number of its first micro-batch."""

    def __init__(self, block: int, cycle: int, async_generate: bool):
        self.block, self.cycle = block, cycle  # micro-batches per generation batch; per all its passes
        self.pool = concurrent.futures.ThreadPoolExecutor(1, "swift-async-rollout") if async_generate else None
        self.ahead: deque = deque()
        self.iterator = None
        self.batches: dict[int, list] = {}
        self.fetched = 0
        self.pending: tuple[int, concurrent.futures.Future] | None = None

    def read(self, epoch_iterator, num_batches: int) -> list:
        """The next `num_batches` micro-batches, reading ahead to the end of the generation batch
        being started (with --async_generate, to the end of the next one's first pass too)."""
        if epoch_iterator is not self.iterator:
            self.iterator, self.ahead = epoch_iterator, deque()
        ahead = self.block + (self.cycle if self.pool is not None else 0)
        while len(self.ahead) < num_batches + ahead:
            try:
                batch = next(epoch_iterator)
            except StopIteration:
                break
            self.batches[self.fetched] = batch
            self.fetched += 1
            self.ahead.append(batch)
        return [self.ahead.popleft() for _ in range(min(num_batches, len(self.ahead)))]

    def prompts_from(self, seq: int) -> list[dict] | None:
        """The prompts of the generation batch whose first micro-batch is `seq` (None if not fetched)."""
        batches = [self.batches.get(s) for s in range(seq, seq + self.block)]
        return None if any(b is None for b in batches) else [p for b in batches for p in b]

    def forget_before(self, seq: int) -> None:
        for old in [s for s in self.batches if s < seq]:
            del self.batches[old]

    def take(self, seq: int) -> Any | None:
        """The rollout generated ahead for the generation batch starting at `seq`, if any; it is
        then no longer pending either way."""
        pending, self.pending = self.pending, None
        if pending is not None and pending[0] == seq:
            return pending[1].result()
        return None

    def start(self, seq: int, generate: Callable, *args) -> None:
        """Generate the rollout of the generation batch starting at `seq` in the background."""
        self.pending = (seq, self.pool.submit(generate, *args))

    def state(self) -> tuple[int, Any] | None:
        """The pending rollout as (sequence number, result), waiting for it (for checkpoints)."""
        return (self.pending[0], self.pending[1].result()) if self.pending is not None else None

    def restore(self, fetched: int, pending: tuple[int, Any] | None) -> None:
        self.fetched = fetched
        if pending is not None:
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(pending[1])
            self.pending = (pending[0], done)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def steps_per_generation(args, a) -> int:
    """Micro-batches per generation batch: --steps_per_generation, PPO's --num_mini_batches or
    --generation_batch_size, by default one optimizer step's."""
    ga = args.gradient_accumulation_steps
    steps = a.steps_per_generation
    if a.num_mini_batches:  # PPO's name: optimizer steps per pass over the rollout batch
        steps = a.num_mini_batches * ga
    if a.generation_batch_size is not None:
        per_step = args.per_device_train_batch_size * args.world_size
        if a.generation_batch_size % per_step:
            raise SwiftError(f"--generation_batch_size ({a.generation_batch_size}) must be a multiple of "
                             f"--per_device_train_batch_size × world size ({per_step})")
        steps = a.generation_batch_size // per_step
    steps = steps or ga
    if steps < 1 or steps % ga:
        raise SwiftError(f"--steps_per_generation ({steps}) must be a positive multiple of "
                         f"--gradient_accumulation_steps ({ga}): each pass over a generation batch is an "
                         "optimizer step of its own")
    return steps


def check_prompts(dataset, args, num_generations: int, steps: int) -> None:
    """One generation batch needs `block` prompts; fewer would train 0 steps. An epoch's last
    partial block is not trained on: say so."""
    if dataset is None or not hasattr(dataset, "__len__"):
        return
    per_rank = args.per_device_train_batch_size // num_generations
    block = per_rank * args.world_size * steps
    n = len(dataset)
    if n < block:
        raise SwiftError(f"--dataset has {n} prompt(s); one generation batch needs {block} "
                         f"(--per_device_train_batch_size {args.per_device_train_batch_size} / "
                         f"--num_generations {num_generations} × {args.world_size} rank(s) × "
                         f"{steps} micro-batch(es) per generation): give more prompts or a "
                         "smaller batch")
    if n % block:
        logger.warning(f"each epoch trains on {n - n % block} of the {n} prompts (whole generation batches of "
                       f"{block}); the other {n % block}, drawn at random each epoch, wait for the next epoch")

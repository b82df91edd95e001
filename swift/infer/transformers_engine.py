"""TransformersEngine: batched generation with a KV cache on any torch device.

A worker thread owns the model. Requests queue up; whenever the worker is free it takes every
waiting request with a compatible config (up to `max_batch_size` sequences) and decodes them
together; once the lean decoding step is in use, requests that arrive meanwhile join the running
batch between steps (continuous batching). Each prompt is prefilled once and its KV cache is
repeated for its `n` samples. Finished or cancelled rows are dropped from the batch at once.
Llama-family models decode with the lean step of `swift.infer.fast_decode` once its first steps
have matched the model's own forward.
"""
from __future__ import annotations

import asyncio
import atexit
import inspect
import threading
import weakref
from collections import deque
from typing import AsyncIterator

import torch

from swift.infer.decoding import Decoding, _Job
from swift.infer.fast_decode import FastDecoder
from swift.infer.protocol import (InferEngine, InferRequest, InferResponse, RequestConfig, StreamDelta, drain,
                                  per_request)
from swift.serving.jobs import POLL, JobControl, JobStopped
from swift.template.base import Template
from swift.utils.checksum import checksum
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)



def answer_end_ids(model, tokenizer, template: Template | None) -> set[int]:
    """What ends an answer: the tokenizer's EOS, the generation config's (Llama-3 and Qwen list
    several) and a named template's end-of-turn token (`Template.end_of_turn_ids`)."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = {tokenizer.eos_token_id, *(configured if isinstance(configured, list) else [configured])}
    return {i for i in ids if i is not None} | (template.end_of_turn_ids() if template else set())


class TransformersEngine(Decoding, InferEngine):
    def __init__(self, model, tokenizer, template: Template, *, max_batch_size: int = 32,
                 max_model_len: int | None = None, default_adapter: str | None = None,
                 processed_logprobs: bool = False, fast_decode: bool = True, inline: bool = False):
        """`default_adapter`: the LoRA adapter of requests that name none (None: the base model).
        `processed_logprobs`: report log-probs of the distribution actually sampled from (after the
        repetition penalty and temperature), as an RL trainer's importance weights need; otherwise
        the model's raw log-probs. `fast_decode`: decode Llama-family models with the lean step of
        `swift.infer.fast_decode` once its first steps have matched the model's own forward.
        `inline`: decode in the thread that calls `infer()` (a trainer's), with no worker thread.
        Torch's CPU kernels keep a pool of spinning worker threads per calling thread, so a trainer
        that runs forwards in its own thread and decodes in another has two pools fighting for the
        cores (decoding ran about 3 times slower on 2 cores); an inline engine serves `infer()` only."""
        self.processed_logprobs = processed_logprobs
        self._fast = FastDecoder.build(model) if fast_decode else None
        self._fast_verified = False
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._keeps_logits = "logits_to_keep" in inspect.signature(base.forward).parameters
        self.model = model.eval()
        self.default_adapter = default_adapter
        self._active_adapter: tuple | None = None
        self.tokenizer = tokenizer
        self.template = template
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len or getattr(model.config, "max_position_embeddings", 2048)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.eos_ids = answer_end_ids(model, tokenizer, template)
        self._pending: deque[_Job] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self._running = 0
        self.inline = inline
        self._thread = None if inline else threading.Thread(target=self._worker, daemon=True, name="swift-engine")
        if self._thread is not None:
            self._thread.start()
        _LIVE_ENGINES.add(self)

    def close(self) -> None:
        """Stop the worker thread: queued and running requests fail with an error. A daemon thread
        still inside torch at interpreter exit can abort the process, so engines are closed at exit."""
        with self._wake:
            if self._closed:
                return
            self._closed = True
            pending, self._pending = list(self._pending), deque()
            self._wake.notify_all()
        for job in pending:
            if not job.cancelled:  # a cancelled job's caller is gone (its event loop may be closed)
                job.deliver(SwiftError("the inference engine was closed"))
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    # -- public API ------------------------------------------------------------------------------
    def sync_weights(self, model, buckets=None) -> None:
        """In process, the engine generates with the trainer's own module, so nothing is copied; a
        different module is copied over, and either way every parameter is checked to match.
        `buckets` (lists of (name, tensor), e.g. gathered from ZeRO-3 partitions) are loaded instead,
        each checked by checksum."""
        if buckets is not None:
            for named in buckets:
                if self.load_weights(named) != checksum([t for _, t in named]):
                    raise SwiftError(f"weight sync failed: {named[0][0]} .. {named[-1][0]} differ after loading")
            return
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())
        mine = dict(self.model.named_parameters())
        for name, p in model.named_parameters():
            q = mine.get(name)
            if q is None or (q.data_ptr() != p.data_ptr() and not torch.equal(q, p)):
                raise SwiftError(f"weight sync failed: engine parameter {name} differs from the trainer's")

    def weight_shapes(self) -> dict[str, list[int]]:
        return {name: list(t.shape) for name, t in self.model.state_dict().items()}

    def load_weights(self, named: list[tuple[str, torch.Tensor]]) -> int:
        """Copy tensors into the model's parameters (cast to their dtype), then fingerprint the
        parameters themselves, so the checksum proves what the engine will generate with."""
        state = self.model.state_dict()
        for name, tensor in named:
            if name not in state or list(state[name].shape) != list(tensor.shape):
                raise SwiftError(f"load_weights: {name} {list(tensor.shape)} does not match the model")
        with torch.no_grad():
            for name, tensor in named:
                state[name].copy_(tensor)
        return checksum([state[name].to(tensor.dtype) for name, tensor in named])

    def _submit(self, request: InferRequest, config: RequestConfig, deliver, on_delta=None) -> _Job:
        if self.inline:
            raise SwiftError("this engine decodes in its caller's thread (a trainer's) and serves infer() only")
        prompt = self.encode(request)
        self.check(prompt, config)
        job = _Job(prompt, config, request.adapter, deliver, on_delta)
        with self._wake:
            self._pending.append(job)
            self._wake.notify()
        return job

    def infer(self, requests: list[InferRequest], config: RequestConfig | list[RequestConfig] | None = None,
              control: JobControl | None = None) -> list[InferResponse]:
        """Queue every request at once, so that a batch of rollouts starts decoding together. With
        `control`, its deadline or cancellation drops the requests' rows at the next decode step and
        raises JobStopped."""
        configs = per_request(config, len(requests))
        prompts = [self.encode(r) for r in requests]
        for prompt, c in zip(prompts, configs):
            self.check(prompt, c)
        results: list = [None] * len(requests)
        left = [len(requests)]
        done = threading.Event()

        def deliver_to(i):
            def deliver(result):
                results[i] = result
                with self._wake:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()
            return deliver

        jobs = [_Job(prompt, c, request.adapter, deliver_to(i))
                for i, (request, prompt, c) in enumerate(zip(requests, prompts, configs))]
        if control is not None:
            control.check()
        with self._wake:
            self._pending.extend(jobs)
            self._wake.notify()
        if self.inline:
            self._drain()
        elif requests:
            while not done.wait(None if control is None else POLL):
                reason = control.stop_reason()
                if reason is not None:
                    for job in jobs:
                        job.cancelled = True  # the rows leave the batch at the next step
                    raise JobStopped(reason)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    async def infer_async(self, request: InferRequest, config: RequestConfig) -> InferResponse:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def deliver(result):
            def settle():
                if future.done():
                    return
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
            _call_soon(loop, settle)

        job = self._submit(request, config, deliver)
        try:
            return await future
        finally:
            job.cancelled = True  # no-op when finished; frees the rows if the caller gave up

    async def stream_async(self, request: InferRequest, config: RequestConfig) -> AsyncIterator[StreamDelta]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def deliver(result):
            if isinstance(result, BaseException):
                _call_soon(loop, queue.put_nowait, result)

        job = self._submit(request, config, deliver, lambda d: _call_soon(loop, queue.put_nowait, d))
        try:
            async for item in drain(queue, config.n):
                yield item
        finally:
            job.cancelled = True  # a client that disconnects frees its rows

    # -- worker ----------------------------------------------------------------------------------
    def _next_batch(self) -> list[_Job] | None:
        with self._wake:
            while not self._pending and not self._closed:
                self._wake.wait()
            if self._closed:
                return None
            first = self._pending.popleft()
            batch, rows, rest = [first], first.config.n, deque()
            key = (first.config.batch_key(), first.adapter)
            while self._pending and not first.alone:
                job = self._pending.popleft()
                if (not job.alone and (job.config.batch_key(), job.adapter) == key
                        and rows + job.config.n <= self.max_batch_size):
                    batch.append(job)
                    rows += job.config.n
                else:
                    rest.append(job)
            self._pending.extendleft(reversed(rest))
            return [j for j in batch if not j.cancelled]

    def load(self) -> dict[str, int]:
        """Requests waiting for a batch, and requests in the batch being decoded."""
        return {"queued": len(self._pending), "running": self._running}

    def _drain(self) -> None:
        """Inline: decode everything queued, in this thread."""
        while True:
            with self._wake:
                if not self._pending or self._closed:
                    return
            jobs = self._next_batch()
            if jobs is None:
                return
            self._run(jobs)

    def _worker(self) -> None:
        while (jobs := self._next_batch()) is not None:
            self._run(jobs)

    def _run(self, jobs: list[_Job]) -> None:
        if jobs:
            self._running = len(jobs)
            try:
                self._set_adapter(jobs[0].adapter or self.default_adapter)
                with torch.inference_mode():
                    self._generate(jobs)
            except Exception as e:  # keep serving; the error goes to the request that caused it
                self._isolate(jobs, e)
            finally:
                self._running = 0

    def _isolate(self, jobs: list[_Job], error: Exception) -> None:
        """A batch failed. Alone, the request fails; in company, each request that has sent its
        client nothing yet runs again in a batch of its own, so only the one that fails alone gets
        the error (a stream that already sent text cannot be replayed: it gets the error)."""
        undone = [j for j in jobs if not j.delivered and not j.cancelled]
        with self._wake:  # under the lock: close() either ran before (nothing is requeued) or runs after
            retry = [] if self._closed else [j for j in undone if len(jobs) > 1 and not j.streamed]
            for job in reversed(retry):
                job.rows, job.alone = [], True
                self._pending.appendleft(job)
            self._wake.notify()
            closed = self._closed
        if retry:
            logger.warning(f"a batch of {len(jobs)} requests failed ({type(error).__name__}: {error}); "
                           f"running {len(retry)} of them alone")
        elif not closed:
            logger.exception("generation failed", exc_info=error)
        for job in undone:
            if job not in retry:
                self._fail(job, error)

    def _requeue_alone(self, jobs: list[_Job], error: Exception) -> None:
        """Requests that failed to join a running batch go back to the front of the queue, each to
        run in a batch of its own (where a fault of its own fails it alone)."""
        with self._wake:
            if self._closed:
                retry, error = [], SwiftError("the inference engine was closed")
            else:
                logger.warning(f"{len(jobs)} requests failed to join the running batch "
                               f"({type(error).__name__}: {error}); running them alone")
                retry = [j for j in jobs if not j.delivered and not j.cancelled]
                for job in reversed(retry):
                    job.rows, job.alone = [], True
                    self._pending.appendleft(job)
        for job in jobs:
            if job not in retry and not job.cancelled:
                self._fail(job, error)

    @staticmethod
    def _fail(job: _Job, error: BaseException) -> None:
        if not job.delivered:
            job.delivered = job.cancelled = True  # its rows leave the batch
            job.deliver(error)

    def activate_adapter(self, name: str | None) -> None:
        """Make `name` (None: the base) the model's active adapter, as a request naming it would."""
        self._set_adapter(name)

    def _set_adapter(self, name: str | None) -> None:
        if hasattr(self.model, "peft_config"):
            if self._active_adapter == (name,):
                return  # switching toggles requires_grad inside PEFT; never touch a training policy needlessly
            self._active_adapter = (name,)
            # PEFT's switches also set requires_grad on the adapters; a training policy's trainable
            # set belongs to its trainer, so it is put back exactly as it was
            trainable = {p: p.requires_grad for p in self.model.parameters()}
            try:
                if name is None:
                    self.model.base_model.disable_adapter_layers()
                else:
                    self.model.base_model.enable_adapter_layers()
                    self.model.set_adapter(name)
            finally:
                for p, flag in trainable.items():
                    p.requires_grad_(flag)
        elif name is not None:
            raise SwiftError(f"adapter '{name}' requested but the engine has no adapters")

    def _take_joiners(self, key: tuple, free: int) -> list[_Job]:
        """Queued requests that join the running batch now: from the front of the queue, in order,
        while they share the batch's sampling settings and adapter and their rows fit. The first
        one that cannot join stops the taking, so the batch drains and that request starts the
        next one (nothing waits behind a stream of newer compatible requests)."""
        taken = []
        with self._wake:
            while self._pending:
                job = self._pending[0]
                if not job.cancelled and (job.alone or (job.config.batch_key(), job.adapter) != key
                                          or job.config.n > free):
                    break
                self._pending.popleft()
                if not job.cancelled:
                    taken.append(job)
                    free -= job.config.n
        return taken


_LIVE_ENGINES: "weakref.WeakSet[TransformersEngine]" = weakref.WeakSet()
atexit.register(lambda: [engine.close() for engine in list(_LIVE_ENGINES)])


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    """Hand a result to the caller's event loop; once that loop is closed nobody waits for it."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass

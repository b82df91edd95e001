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
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

import torch
from transformers import DynamicCache

from swift.infer.fast_decode import FastDecoder
from swift.infer.protocol import (Choice, InferEngine, InferRequest, InferResponse, RequestConfig, StreamDelta,
                                  TokenLogprob, drain, per_request)
from swift.infer.sampling import apply_openai_penalties, apply_repetition_penalty, sample
from swift.serving.jobs import POLL, JobControl, JobStopped
from swift.template.base import Template
from swift.utils.checksum import checksum
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)


@dataclass
class _Job:
    prompt: list[int]
    config: RequestConfig
    adapter: str | None
    deliver: Callable[[InferResponse | BaseException], None]
    on_delta: Callable[[StreamDelta], None] | None = None
    cancelled: bool = False
    rows: list["_Row"] = field(default_factory=list)
    delivered: bool = False
    streamed: bool = False  # a delta already reached the client
    alone: bool = False  # its batch failed: it runs in a batch of its own
    prompt_logprobs: list | None = None


@dataclass
class _Row:
    job: _Job
    index: int  # choice index within the job
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    sent: int = 0  # characters already streamed
    sent_tokens: int = 0  # tokens (and their log-probs) already streamed
    finish: str | None = None
    text: str = ""
    stop_token_id: int | None = None  # the EOS id that ended the row
    stop_logprob: float | None = None


class TransformersEngine(InferEngine):
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
        self.model = model.eval()
        self.default_adapter = default_adapter
        self._active_adapter: tuple | None = None
        self.tokenizer = tokenizer
        self.template = template
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len or getattr(model.config, "max_position_embeddings", 2048)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        eos = {tokenizer.eos_token_id}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos])
        self.eos_ids = {e for e in eos if e is not None}
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

    def _prefill(self, jobs: list[_Job]):
        """Run the left-padded prompts once: (their KV cache, the next-token logits, the attention
        mask, the positions), with each job's prompt log-probs when asked for."""
        device = next(self.model.parameters()).device
        cfg = jobs[0].config
        pad = self.tokenizer.pad_token_id
        width = max(len(j.prompt) for j in jobs)
        ids = torch.tensor([[pad] * (width - len(j.prompt)) + j.prompt for j in jobs], device=device)
        mask = torch.tensor([[0] * (width - len(j.prompt)) + [1] * len(j.prompt) for j in jobs], device=device)
        cache = self.model.new_cache() if hasattr(self.model, "new_cache") else DynamicCache()  # a wrapper's own
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        prefill = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                             use_cache=True).logits
        if cfg.prompt_logprobs is not None:
            for b, j in enumerate(jobs):
                j.prompt_logprobs = self._prompt_logprobs(prefill[b, width - len(j.prompt):], j.prompt,
                                                          cfg.prompt_logprobs)
        return cache, prefill[:, -1].float(), mask, positions

    def _sample_step(self, rows: list[_Row], logits: torch.Tensor, cfg: RequestConfig, stop_len: int) -> torch.Tensor:
        """Sample each row's next token from `logits` (the batch's shared sampling settings `cfg`) and
        advance the row (a row that fails fails its own request alone); returns the tokens."""
        scored = logits
        if cfg.repetition_penalty != 1.0:
            scored = apply_repetition_penalty(logits, [r.job.prompt + r.tokens for r in rows], cfg.repetition_penalty)
        scored = apply_openai_penalties(scored, [r.tokens for r in rows], cfg.presence_penalty, cfg.frequency_penalty,
                                        cfg.logit_bias)
        next_tokens = sample(scored, cfg, [r.generator for r in rows])
        logprobs = None
        if cfg.logprobs:
            processed = self.processed_logprobs and cfg.temperature > 0
            logprobs = torch.log_softmax(scored / cfg.temperature if processed else logits, -1)
        for i, (row, token) in enumerate(zip(rows, next_tokens.tolist())):
            if row.job.cancelled:
                continue
            try:
                self._advance(row, token, logprobs[i] if logprobs is not None else None, stop_len)
            except Exception as e:  # this row's request fails; its batch mates go on
                logger.exception("a request failed while decoding")
                self._fail(row.job, e)
        return next_tokens

    def _open_rows(self, jobs: list[_Job]):
        """Prefill `jobs` and give each its rows: (cache, next-token logits, padding mask and last
        prompt position per row, the rows). Each prompt is prefilled once; its cache is repeated
        for its n samples."""
        device = next(self.model.parameters()).device
        cache, logits, mask, positions = self._prefill(jobs)
        owner = torch.tensor([i for i, j in enumerate(jobs) for _ in range(j.config.n)], device=device)
        cache.batch_select_indices(owner)
        for j in jobs:
            j.rows = [_Row(j, k, _generator(j.config.seed, k, device)) for k in range(j.config.n)]
        return cache, logits[owner], mask[owner], positions[owner, -1], [r for j in jobs for r in j.rows]

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

    def _generate(self, jobs: list[_Job]) -> None:
        """Decode `jobs` together. Once the lean decoding step is in use (see fast_decode), queued
        requests with the same sampling settings join between decoding steps (continuous batching):
        they are prefilled and their rows added while the others go on. `jobs` is kept up to date
        (finished requests leave it, joiners enter it) for the caller's error handling."""
        device = next(self.model.parameters()).device
        cfg = jobs[0].config
        if cfg.max_tokens == 0:  # the prompt scored, nothing generated
            self._prefill(jobs)
            for j in jobs:
                j.rows = [_Row(j, k, None, finish="length") for k in range(j.config.n)]
                self._maybe_deliver(j)
            return
        key = (cfg.batch_key(), jobs[0].adapter)
        joinable = not any(j.alone for j in jobs)  # a request rerun alone stays alone
        cache, logits, mask, last_pos, rows = self._open_rows(jobs)
        stop_len = max((len(s) for j in jobs for s in j.config.stop), default=0)
        unpadded = bool(mask.all())
        fast, checks = self._fast, []  # until verified, both paths run and the model's own logits are used
        if fast is not None:
            fast.start(cache, mask, max(j.config.max_tokens for j in jobs))
            if self._fast_verified:
                cache = mask = None  # the fast path holds the keys, values and padding from here on
        while True:
            next_tokens = self._sample_step(rows, logits, cfg, stop_len)
            keep = [i for i, r in enumerate(rows) if r.finish is None and not r.job.cancelled]
            for job in jobs:
                self._maybe_deliver(job)
            jobs[:] = [j for j in jobs if not j.delivered and not j.cancelled]
            self._running = len(jobs)
            if not keep:
                break
            if self._closed:
                raise SwiftError("the inference engine was closed")
            if len(keep) < len(rows):
                index = torch.tensor(keep, device=device)
                if cache is not None:
                    cache.batch_select_indices(index)
                    mask = mask[index]
                if fast is not None:
                    fast.select(index)
                last_pos, next_tokens = last_pos[index], next_tokens[index]
                rows = [rows[i] for i in keep]
            last_pos = last_pos + 1
            if fast is not None:
                fast_logits = fast.step(next_tokens, last_pos).float()
                if self._fast_verified:
                    logits, cache, mask = fast_logits, None, None
                    joiners = self._take_joiners(key, self.max_batch_size - len(rows)) \
                        if joinable and self._pending else []
                    if joiners:
                        try:
                            new_cache, new_logits, new_mask, new_pos, new_rows = self._open_rows(joiners)
                            fast.join(new_cache, new_mask)  # all or nothing
                        except Exception as e:  # the running rows go on; the newcomers run alone later
                            self._requeue_alone(joiners, e)
                            continue
                        jobs.extend(joiners)
                        self._running = len(jobs)
                        logits = torch.cat([logits, new_logits])
                        last_pos = torch.cat([last_pos, new_pos])
                        rows += new_rows
                        stop_len = max([stop_len] + [len(s) for j in joiners for s in j.config.stop])
                    continue
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
            # without left padding the causal cache needs no mask, which spares building one per token
            logits = self.model(input_ids=next_tokens[:, None], attention_mask=None if unpadded else mask,
                                position_ids=last_pos[:, None], past_key_values=cache,
                                use_cache=True).logits[:, -1].float()
            if fast is not None:
                checks.append((fast_logits, logits))
                if len(checks) == _FAST_CHECK_STEPS:
                    fast = self._verify_fast(checks)

    def _verify_fast(self, checks: list) -> FastDecoder | None:
        if self._fast.agrees_with(checks):
            self._fast_verified = True
            return self._fast
        logger.warning("fast decoding disabled: its logits differ from the model's own forward")
        self._fast = None
        return None

    def _advance(self, row: _Row, token: int, logprobs: torch.Tensor | None, stop_len: int) -> None:
        cfg = row.job.config
        live_text = bool(cfg.stop) or row.job.on_delta is not None  # else the text is decoded once, at the end
        if token in self.eos_ids:
            row.finish, row.stop_token_id = "stop", token
            if logprobs is not None:
                row.stop_logprob = logprobs[token].item()
        else:
            row.tokens.append(token)
            if logprobs is not None:
                row.logprobs.append(self._logprob(token, logprobs, cfg.top_logprobs))
            hit = -1
            if live_text:
                row.text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
                hit = min((row.text.find(s) for s in cfg.stop if s in row.text), default=-1)
            if hit >= 0:
                row.text, row.finish = row.text[:hit], "stop"
            elif len(row.tokens) >= cfg.max_tokens:
                row.finish = "length"
        if row.finish and not live_text:
            row.text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
        if row.job.on_delta is not None:
            safe = len(row.text) if row.finish else max(row.sent, len(row.text) - max(stop_len - 1, 0))
            if row.text.endswith("\ufffd") and not row.finish:  # half of a multi-byte character
                safe = min(safe, len(row.text) - 1)
            if safe > row.sent or row.finish:
                # the tokens held back with their text (a possible stop string, half a character) go
                # out now, each with its log-prob
                row.job.streamed = True
                row.job.on_delta(StreamDelta(row.index, row.text[row.sent:safe], row.tokens[row.sent_tokens:],
                                             row.finish, (row.logprobs[row.sent_tokens:] or None) if cfg.logprobs else None))
                row.sent, row.sent_tokens = safe, len(row.tokens)

    def _prompt_logprobs(self, logits: torch.Tensor, prompt: list[int], top: int) -> list[TokenLogprob]:
        """Each prompt token's log-prob under the positions before it (`logits`: the prompt's own rows);
        the first token's is None."""
        logprobs = torch.log_softmax(logits[:-1].float(), -1)
        first = TokenLogprob(self.tokenizer.decode([prompt[0]]), prompt[0], None)
        return [first] + [self._logprob(token, logprobs[t], top) for t, token in enumerate(prompt[1:])]

    def _logprob(self, token: int, logprobs: torch.Tensor, top: int) -> TokenLogprob:
        tops = []
        if top:
            values, indices = logprobs.topk(top)
            tops = [(self.tokenizer.decode([i]), v) for v, i in zip(values.tolist(), indices.tolist())]
        return TokenLogprob(self.tokenizer.decode([token]), token, logprobs[token].item(), tops)

    def _maybe_deliver(self, job: _Job) -> None:
        if job.delivered or job.cancelled or any(r.finish is None for r in job.rows):
            return
        job.delivered = True
        choices = [Choice(r.index, r.text, r.tokens, r.finish, r.logprobs if job.config.logprobs else None,
                          r.stop_token_id, r.stop_logprob) for r in job.rows]
        job.deliver(InferResponse(choices, len(job.prompt), sum(len(r.tokens) for r in job.rows), job.prompt_logprobs))


_FAST_CHECK_STEPS = 2  # decoding steps compared with the model's forward before the fast path is trusted
_LIVE_ENGINES: "weakref.WeakSet[TransformersEngine]" = weakref.WeakSet()
atexit.register(lambda: [engine.close() for engine in list(_LIVE_ENGINES)])


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    """Hand a result to the caller's event loop; once that loop is closed nobody waits for it."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


def _generator(seed: int | None, index: int, device: torch.device) -> torch.Generator | None:
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(seed + index)

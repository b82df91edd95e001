"""The decoding half of TransformersEngine: prefill, the continuous-batching decode loop, sampling
and per-row bookkeeping (tokens, stop strings, log-probs, streaming deltas). The engine mixes it in
and supplies the queue (`_take_joiners`, `_requeue_alone`, `_fail`), the model and tokenizer."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import DynamicCache

from swift.infer.fast_decode import FastDecoder
from swift.infer.protocol import Choice, InferResponse, RequestConfig, StreamDelta, TokenLogprob
from swift.infer.sampling import apply_openai_penalties, apply_repetition_penalty, sample
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


class Decoding:
    """Mixed into TransformersEngine (see there for the attributes it reads)."""

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
        # only the last position's logits are needed, unless the prompt's own log-probs are asked for
        keep = {"logits_to_keep": 1} if cfg.prompt_logprobs is None and self._keeps_logits else {}
        prefill = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                             use_cache=True, **keep).logits
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
                order = fast.select(keep) if fast is not None else keep  # the fast path may reorder rows
                index = torch.tensor(order, device=device)
                if cache is not None:
                    cache.batch_select_indices(index)
                    mask = mask[index]
                last_pos, next_tokens = last_pos[index], next_tokens[index]
                rows = [rows[i] for i in order]
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
                            fast.join(new_cache, new_mask, self.max_batch_size)  # all or nothing
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


def _generator(seed: int | None, index: int, device: torch.device) -> torch.Generator | None:
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(seed + index)

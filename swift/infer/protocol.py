"""The one inference protocol every generating command uses (DESIGN.md §3).

A request is a conversation (`messages`, optional `tools`), a raw `prompt`, or `input_ids`.
A response is OpenAI-shaped: choices with text, token ids, finish_reason and optional logprobs,
plus token usage.
"""
from __future__ import annotations

import abc
import asyncio
import functools
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from swift.serving.jobs import POLL, JobControl, JobStopped
from swift.utils.registry import SwiftError


@dataclass
class InferRequest:
    messages: list[dict] | None = None
    prompt: str | None = None
    input_ids: list[int] | None = None
    tools: list[dict] | None = None
    adapter: str | None = None  # name of a LoRA adapter loaded in the engine

    def __post_init__(self) -> None:
        given = sum(x is not None for x in (self.messages, self.prompt, self.input_ids))
        if given != 1:
            raise SwiftError("a request needs exactly one of messages, prompt or input_ids")
        if self.messages is not None and not self.messages:
            raise SwiftError("messages must not be empty")
        if self.prompt is not None and not self.prompt:
            raise SwiftError("prompt must not be empty")
        if self.input_ids is not None and not self.input_ids:
            raise SwiftError("input_ids must not be empty")


# below this a sampling temperature is greedy decoding (what it approaches), instead of dividing the
# logits into infinities
MIN_TEMPERATURE = 1e-5


@dataclass
class RequestConfig:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    # OpenAI's penalties, over the tokens generated so far: logit -= presence·[count > 0] + frequency·count
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit before sampling
    n: int = 1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    # the log-prob of every prompt token after the first, with this many alternatives (vLLM's
    # `prompt_logprobs`); with it, max_tokens may be 0: the prompt is scored, nothing generated
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        checks = [
            (self.max_tokens >= (0 if self.prompt_logprobs is not None else 1),
             "max_tokens must be at least 1 (0 only when the prompt is scored)"),
            (self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20, "prompt logprobs must be between 0 and 20"),
            (0 <= self.temperature < float("inf"), "temperature must be a finite number >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k >= 0, "top_k must be >= 0"),
            (0 < self.repetition_penalty < float("inf"), "repetition_penalty must be a finite number > 0"),
            (self.seed is None or -2 ** 63 <= self.seed < 2 ** 63 - 2 ** 10, "seed must fit in 63 bits"),
            (1 <= self.n <= 128, "n must be between 1 and 128"),
            (0 <= self.top_logprobs <= 20, "top_logprobs must be between 0 and 20"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be between -2 and 2"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be between -2 and 2"),
            (self.logit_bias is None or (len(self.logit_bias) <= 300 and all(
                isinstance(k, int) and k >= 0 and -100 <= v <= 100 for k, v in self.logit_bias.items())),
             "logit_bias maps at most 300 token ids to values between -100 and 100"),
        ]
        for ok, message in checks:
            if not ok:
                raise SwiftError(message)
        if 0 < self.temperature < MIN_TEMPERATURE:  # logits / 1e-300 overflow to inf and sample NaN
            self.temperature = 0.0

    def openai_fields(self, max_tokens: bool = True) -> dict:
        """The sampling fields of an OpenAI-style request body (the optional ones only when set)."""
        body: dict = {"temperature": self.temperature, "top_p": self.top_p, "n": self.n}
        optional = {"max_tokens": self.max_tokens if max_tokens else None, "seed": self.seed,
                    "stop": list(self.stop) or None, "top_k": self.top_k or None,
                    "repetition_penalty": self.repetition_penalty if self.repetition_penalty != 1.0 else None,
                    "presence_penalty": self.presence_penalty or None, "frequency_penalty": self.frequency_penalty or None,
                    "logit_bias": {str(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None}
        return {**body, **{k: v for k, v in optional.items() if v is not None}}

    def batch_key(self) -> tuple:
        """Requests with equal keys can share a decoding batch."""
        return (self.temperature, self.top_p, self.top_k, self.repetition_penalty, self.presence_penalty,
                self.frequency_penalty, tuple(sorted((self.logit_bias or {}).items())), self.logprobs,
                self.top_logprobs, self.prompt_logprobs, self.max_tokens == 0)


@dataclass
class TokenLogprob:
    token: str
    token_id: int
    logprob: float | None  # None only for a prompt's first token
    top_logprobs: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class Choice:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    logprobs: list[TokenLogprob] | None = None
    # the end-of-sequence token the model sampled to stop (one of the generation config's EOS ids),
    # which `token_ids` and `text` leave out; None when it stopped on a stop string or the length limit
    stop_token_id: int | None = None
    stop_logprob: float | None = None  # its log-prob, when log-probs were asked for

    @property
    def message(self) -> ChoiceMessage:
        """ms-swift's `response_choice.message` (`role`, `content`): a multi-turn scheduler written
        for ms-swift reads the answer there (before 2026-12-07 it had to read `.text`)."""
        return ChoiceMessage(content=self.text)

    def sampled_token_ids(self) -> list[int]:
        """Every token the model sampled, the one that ended generation included (what a trainer
        that learns from this answer must train on)."""
        return list(self.token_ids) + ([self.stop_token_id] if self.stop_token_id is not None else [])


@dataclass(frozen=True)
class ChoiceMessage:
    """A choice's answer as a chat message (ms-swift's `ChatMessage`, without parsed tool calls)."""
    content: str
    role: str = "assistant"


@dataclass
class InferResponse:
    choices: list[Choice]
    prompt_tokens: int
    completion_tokens: int
    # with RequestConfig.prompt_logprobs: one entry per prompt token; the first has logprob None
    # (nothing predicts it)
    prompt_logprobs: list[TokenLogprob] | None = None

    @property
    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


@dataclass
class StreamDelta:
    """One streamed piece of one choice; the last piece of a choice carries its finish_reason."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None


def fit_length(ids: list[int], limit: int | None, truncation: str, what: str) -> list[int]:
    """`ids` cut to `limit` tokens ("left" keeps the end, "right" the start) or refused ("delete")."""
    if limit is None or len(ids) <= limit:
        return ids
    if truncation == "delete":
        raise SwiftError(f"the {what}'s {len(ids)} tokens exceed --max_length {limit} (--truncation_strategy delete "
                         "refuses it; left or right cuts it)")
    return ids[-limit:] if truncation == "left" else ids[:limit]


class InferEngine(abc.ABC):
    """Implementations: TransformersEngine (built in), VllmEngine (optional)."""

    tokenizer: Any
    template: Any
    max_model_len: int
    vocab_size: int | None = None  # token ids at or above it are refused
    # --max_length of the generating commands: a longer prompt is refused ("delete") or cut ("left"
    # keeps its end, "right" its start), as ms-swift's inference does; None: only the context bounds it
    prompt_limit: int | None = None
    truncation: str = "delete"

    def encode(self, request: InferRequest) -> list[int]:
        """Prompt token ids of a request (conversations get the template's generation prompt)."""
        if request.input_ids is not None:
            return self.fit_prompt(list(request.input_ids))
        self.check_text_length([request.prompt] if request.prompt is not None else
                               [m.get("content") for m in request.messages] + [str(request.tools or "")] +
                               [str(m.get("tool_calls") or "") for m in request.messages])
        if request.prompt is not None:
            return self.fit_prompt(self.tokenizer(request.prompt, add_special_tokens=False)["input_ids"])
        return self.fit_prompt(self.template.encode_prompt(request.messages, tools=request.tools))

    def fit_prompt(self, ids: list[int]) -> list[int]:
        """`ids` within `prompt_limit` (--max_length), or a SwiftError under --truncation_strategy delete."""
        return fit_length(ids, self.prompt_limit, self.truncation, "prompt")

    def check_text_length(self, texts: list) -> None:
        """Refuse text that cannot fit the context before tokenising it (a megabyte of text costs
        seconds to tokenise): a token spells at most `longest_token` characters, so text of more
        than max_model_len × longest_token characters is more tokens than the context holds."""
        chars = sum(len(t) for t in texts if isinstance(t, str))
        if chars > self.max_model_len * self.longest_token:
            raise SwiftError(f"the prompt's {chars} characters are more than the model's context of "
                             f"{self.max_model_len} tokens can hold (at most {self.longest_token} characters a token)")

    @functools.cached_property
    def longest_token(self) -> int:
        """Characters in the vocabulary's longest token (byte-level and SentencePiece vocabularies
        spell a token with at least as many characters as the text it stands for)."""
        return max((len(t) for t in self.tokenizer.get_vocab()), default=1)

    def check(self, prompt: list[int], config: RequestConfig) -> None:
        """Refuse what would fail inside a batch: token ids outside the vocabulary, or a prompt and
        answer longer than the context."""
        bad = next((t for t in [*prompt, *(config.logit_bias or {})] if isinstance(t, bool) or not isinstance(t, int)
                    or t < 0 or (self.vocab_size is not None and t >= self.vocab_size)), None)
        if bad is not None:
            raise SwiftError(f"token id {bad!r} is not in the vocabulary (0..{(self.vocab_size or 0) - 1})")
        if len(prompt) + config.max_tokens > self.max_model_len:
            raise SwiftError(f"prompt ({len(prompt)} tokens) + max_tokens ({config.max_tokens}) exceeds the "
                             f"model's context of {self.max_model_len} tokens")

    @abc.abstractmethod
    async def infer_async(self, request: InferRequest, config: RequestConfig) -> InferResponse:
        """Generate for one request; concurrent calls are batched by the engine."""

    @abc.abstractmethod
    def stream_async(self, request: InferRequest, config: RequestConfig) -> AsyncIterator[StreamDelta]:
        """Generate for one request, yielding text pieces as tokens are produced."""

    def close(self) -> None:
        """Release the engine's resources (processes, threads); the engine is unusable afterwards."""

    def sync_weights(self, model) -> None:
        """Make the engine generate with `model`'s current weights, and check that it does."""
        raise SwiftError(f"{type(self).__name__} cannot take weights from a trainer")

    def reset_prefix_cache(self) -> None:
        """Forget cached prompt prefixes (computed with older weights); engines without one ignore it."""

    def weight_shapes(self) -> dict[str, list[int]]:
        """Shape of every weight `load_weights` accepts, by Hugging Face name."""
        raise SwiftError(f"{type(self).__name__} cannot take weights from a trainer")

    def load_weights(self, named: list[tuple[str, Any]]) -> int:
        """Load Hugging Face-named tensors; return the checksum (`swift.utils.checksum`) of the
        tensors as the engine holds them afterwards, in the given order."""
        raise SwiftError(f"{type(self).__name__} cannot take weights from a trainer")

    def infer(self, requests: list[InferRequest], config: RequestConfig | list[RequestConfig] | None = None,
              control: JobControl | None = None) -> list[InferResponse]:
        """Generate for many requests at once (they share decoding batches); `config` is one for all
        or one per request (e.g. each with its own `max_tokens`). With `control`, its deadline or
        cancellation cancels the requests (the engine frees their rows) and raises JobStopped."""
        configs = per_request(config, len(requests))

        async def run() -> list[InferResponse]:
            work = asyncio.gather(*(self.infer_async(r, c) for r, c in zip(requests, configs)))
            while control is not None:
                done, _ = await asyncio.wait({work}, timeout=POLL)
                if done:
                    break
                reason = control.stop_reason()
                if reason is not None:
                    work.cancel()
                    try:
                        await work
                    except BaseException:  # noqa: BLE001 - the cancellation itself
                        pass
                    raise JobStopped(reason)
            return list(await work)

        return asyncio.run(run())


def per_request(config: RequestConfig | list[RequestConfig] | None, n: int) -> list[RequestConfig]:
    if isinstance(config, list):
        if len(config) != n:
            raise SwiftError(f"{len(config)} request configs for {n} requests")
        return config
    return [config or RequestConfig()] * n


async def drain(queue: "asyncio.Queue[StreamDelta | BaseException]", n: int) -> AsyncIterator[StreamDelta]:
    """Yield deltas from a queue fed by an engine thread until all `n` choices finished; re-raise errors."""
    finished = 0
    while finished < n:
        item = await queue.get()
        if isinstance(item, BaseException):
            raise item
        finished += item.finish_reason is not None
        yield item

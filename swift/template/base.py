"""Templates turn conversations into token ids and labels.

Every template renders a conversation to one string plus the character spans that carry loss
(assistant content and its end-of-turn token). The string is tokenized once, with offsets, so the
ids equal what `tokenizer.apply_chat_template` gives for the same text, and a token gets a label
when it starts inside a loss span.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from swift.utils.registry import Registry, SwiftError

IGNORE_INDEX = -100
ROLES = ("system", "user", "assistant", "tool")

Span = tuple[int, int]


class RowError(ValueError):
    """A row that cannot be encoded (too long, no assistant turn); counted and dropped, or raised with --strict."""


@dataclass
class Encoded:
    input_ids: list[int]
    labels: list[int]


class Template(abc.ABC):
    """Base class; subclasses implement `render`."""

    name = "base"
    default_system: str | None = None

    def __init__(self, tokenizer: PreTrainedTokenizerBase, *, system: str | None = None, max_length: int | None = None,
                 truncation_strategy: str = "delete", loss_scale: str = "default"):
        self.tokenizer = tokenizer
        self.system = system if system is not None else self.default_system
        self.max_length = max_length
        self.truncation_strategy = truncation_strategy
        self.loss_scale = loss_scale

    # -- rendering -------------------------------------------------------------------------------
    @abc.abstractmethod
    def render(self, messages: list[dict], add_generation_prompt: bool = False,
               tools: list | None = None) -> tuple[str, list[Span]]:
        """Return the full text and the spans of every assistant turn (content + end token)."""

    def with_system(self, messages: list[dict]) -> list[dict]:
        if self.system is not None and (not messages or messages[0]["role"] != "system"):
            return [{"role": "system", "content": self.system}, *messages]
        return messages

    # -- encoding --------------------------------------------------------------------------------
    def encode(self, row: dict) -> Encoded:
        """Encode a standard row (`messages`, or `text` for raw pre-training text) for training."""
        if "text" in row and "messages" not in row:
            return self._truncate(self._encode_text(row["text"]))
        messages = self.with_system(row["messages"])
        if not any(m["role"] == "assistant" for m in messages):
            raise RowError("no assistant message to train on")
        text, spans = self.render(messages, tools=row.get("tools"))
        if self.loss_scale == "last_round":
            spans = spans[-1:]
        ids, starts = self._tokenize(text)
        if self.loss_scale == "all":
            labels = list(ids)
        else:
            labels = [t if _inside(s, spans) else IGNORE_INDEX for t, s in zip(ids, starts)]
        return self._truncate(Encoded(ids, labels))

    def encode_prompt(self, messages: list[dict], tools: list | None = None) -> list[int]:
        """Token ids of a conversation followed by the generation prompt (for inference)."""
        messages = self.with_system(messages)
        if messages and messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        text, _ = self.render(messages, add_generation_prompt=True, tools=tools)
        return self._tokenize(text)[0]

    def encode_continuation(self, messages: list[dict], tools: list | None = None) -> list[int]:
        """Token ids from which generation continues: after a generation prompt, or inside the last
        assistant message when the conversation ends with one (a multi-turn rollout that edits it)."""
        messages = self.with_system(messages)
        if not messages or messages[-1]["role"] != "assistant":
            return self.encode_prompt(messages, tools)
        text, _ = self.render(messages[:-1], add_generation_prompt=True, tools=tools)
        return self._tokenize(text + messages[-1]["content"])[0]

    def _encode_text(self, text: str) -> Encoded:
        ids = self._tokenize(text)[0] + [self.tokenizer.eos_token_id]
        return Encoded(ids, list(ids))

    def _tokenize(self, text: str) -> tuple[list[int], list[int]]:
        out = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(out["input_ids"]), [s for s, _ in out["offset_mapping"]]

    def _truncate(self, enc: Encoded) -> Encoded:
        n, limit = len(enc.input_ids), self.max_length
        if limit is None or n <= limit:
            pass
        elif self.truncation_strategy == "delete":
            raise RowError(f"{n} tokens exceed --max_length {limit}")
        elif self.truncation_strategy == "left":
            enc = Encoded(enc.input_ids[-limit:], enc.labels[-limit:])
        else:
            enc = Encoded(enc.input_ids[:limit], enc.labels[:limit])
        if all(label == IGNORE_INDEX for label in enc.labels):
            raise RowError("no tokens left to train on after truncation")
        return enc


def _inside(pos: int, spans: list[Span]) -> bool:
    return any(s <= pos < e for s, e in spans)


TEMPLATES: Registry[type[Template]] = Registry("template")

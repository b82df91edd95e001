"""Templates turn conversations into token ids and labels.

Every template renders a conversation to one string plus the character spans that carry loss
(assistant content and its end-of-turn token). The string is tokenized once, with offsets, so the
ids equal what `tokenizer.apply_chat_template` gives for the same text, and a token gets a label
when it starts inside a loss span.
"""
from __future__ import annotations

import abc
import copy
import json
import secrets
import threading
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from swift.utils.registry import Registry, SwiftError

IGNORE_INDEX = -100
_PLAIN_LOCK = threading.Lock()
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
    # Serving sets this: control-token text inside a message's content (a client typing
    # "<|im_start|>system") is encoded as plain text, so only the template writes control tokens.
    split_special_tokens = False

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
        """Return the full text and the spans of every assistant turn (content + end token); a
        prompt (`add_generation_prompt`) needs no spans, and `jinja` computes none for it."""

    def render_text(self, messages: list[dict]) -> str:
        """The conversation's text alone, as a reward model scores it (no loss spans)."""
        return self.render(messages)[0]

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
        return self._encode_rendered(messages, tools)

    def encode_continuation(self, messages: list[dict], tools: list | None = None,
                            trusted_continuation: bool = False) -> list[int]:
        """Token ids from which generation continues: after a generation prompt, or inside the last
        assistant message when the conversation ends with one (a multi-turn rollout that edits it).
        `trusted_continuation`: that last message is the server's own text (a forced start), whose
        control tokens stay control tokens."""
        messages = self.with_system(messages)
        if not messages or messages[-1]["role"] != "assistant":
            return self.encode_prompt(messages, tools)
        return self._encode_rendered(messages[:-1], tools, continuation=messages[-1]["content"],
                                     trusted_continuation=trusted_continuation)

    def _encode_rendered(self, messages: list[dict], tools: list | None, continuation: str = "",
                         trusted_continuation: bool = False) -> list[int]:
        """Ids of the rendered conversation plus `continuation` (after the generation prompt). With
        `split_special_tokens`, every message content that holds control-token text is rendered as a
        placeholder and tokenized on its own as plain text; the template's own text keeps its tokens.
        Control-token text in tool signatures, tool calls or names (rendered as JSON or inline) is
        refused."""
        specials = self._special_texts() if self.split_special_tokens else ()
        plain: dict[str, str] = {}
        if specials:
            rest = json.dumps([tools, [{k: v for k, v in m.items() if k != "content"} for m in messages]],
                              ensure_ascii=False, default=str)
            if any(s in rest for s in specials):
                raise RowError("control-token text in tools, tool calls or message names is refused (only message "
                               "content may hold it, as plain text)")
            nonce = secrets.token_hex(8)
            masked = []
            for i, m in enumerate(messages):
                content = m.get("content")
                if isinstance(content, str) and any(s in content for s in specials):
                    key = f"SWIFTPLAIN{nonce}N{i}E"
                    plain[key] = content
                    m = {**m, "content": key}
                masked.append(m)
            messages = masked
        text, _ = self.render(messages, add_generation_prompt=True, tools=tools)
        split_tail = bool(specials) and not trusted_continuation and any(s in continuation for s in specials)
        if not plain and not split_tail:
            return self._tokenize(text + continuation)[0]
        ids, pos = [], 0
        for key, content in plain.items():  # placeholders appear in message order
            at = text.find(key, pos)
            if at < 0:
                raise RowError(f"the {self.name} template dropped a message's content, so its control-token text "
                               "cannot be encoded as plain text")
            ids += self._tokenize(text[pos:at])[0] + self._tokenize(content, split=True)[0]
            pos = at + len(key)
        if split_tail:
            return ids + self._tokenize(text[pos:])[0] + self._tokenize(continuation, split=True)[0]
        return ids + self._tokenize(text[pos:] + continuation)[0]

    def _plain_tokenizer(self):
        """A copy of the tokenizer that reads control-token text as plain text. A copy, set once:
        passing `split_special_tokens` per call flips a flag on the shared Rust tokenizer, which
        requests encoded in other threads at the same time would see (or fail on)."""
        with _PLAIN_LOCK:
            if getattr(self, "_plain", None) is None:
                plain = copy.deepcopy(self.tokenizer)
                plain.split_special_tokens = True
                if hasattr(plain, "_tokenizer"):
                    plain._tokenizer.encode_special_tokens = True
                self._plain = plain
        return self._plain

    def end_of_turn_ids(self) -> set[int]:
        """Token ids that end an answer besides the model's EOS: generation stops at them, as at
        ms-swift's template stop words. None for a model's own (Jinja) template: where its turn ends
        is not known from the text alone (Harmony's `<|end|>` closes one channel and the answer goes
        on), and a chat model's generation config lists its end-of-turn token already."""
        return set()

    def _special_texts(self) -> tuple[str, ...]:
        """The text of every special (control) token the tokenizer recognises in input text."""
        return tuple(t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special and t.content)

    def _encode_text(self, text: str) -> Encoded:
        ids = self._tokenize(text)[0] + [self.tokenizer.eos_token_id]
        return Encoded(ids, list(ids))

    def _tokenize(self, text: str, split: bool = False) -> tuple[list[int], list[int]]:
        if not text:
            return [], []
        tokenizer = self._plain_tokenizer() if split else self.tokenizer
        out = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
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

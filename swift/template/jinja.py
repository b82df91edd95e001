"""`--template jinja`: the tokenizer's own chat template. A prompt is its rendering with the
generation prompt; for training, each assistant turn's span is found in the rendering of the whole
conversation (`JinjaTemplate.render`)."""
from __future__ import annotations

import os

import jinja2

from swift.template.base import RowError, Span, Template
from swift.utils.registry import SwiftError
from swift.plugin import register


@register("template", "jinja")
class JinjaTemplate(Template):
    name = "jinja"

    def __init__(self, tokenizer, **kwargs):
        if not getattr(tokenizer, "chat_template", None):
            raise SwiftError("--template jinja needs a tokenizer with a chat_template; pass --template chatml|qwen|llama3")
        super().__init__(tokenizer, **kwargs)

    def _apply(self, messages: list[dict], add_generation_prompt: bool, tools: list | None) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)
        except jinja2.TemplateSyntaxError as e:
            raise SwiftError(f"the tokenizer's chat_template is not valid Jinja: {e}") from None
        except jinja2.TemplateError as e:  # its raise_exception: "System role not supported", role alternation
            raise RowError(f"the tokenizer's chat_template refused this conversation: {e}") from None

    def render_text(self, messages: list[dict]) -> str:
        return self._apply(messages, False, None)  # no turn to locate: any conversation the template renders

    def render(self, messages: list[dict], add_generation_prompt: bool = False,
               tools: list | None = None) -> tuple[str, list[Span]]:
        """The template's text. A prompt (with the generation prompt) gets no spans. Otherwise each
        assistant turn's span is its text in the rendering of the whole conversation, through its
        end-of-turn marker: from where that text leaves the template's prompt for the turn (the
        messages before it with the generation prompt; R1-style prompts end in `<think>\\n`, which
        the rendered turn may lack) to the end of the turn rendered as the conversation's last
        message, of which the whole text may hold only the tail (Qwen3's template renders earlier
        turns without their reasoning and without the empty `<think>` block the last one gets).
        A turn that cannot be located so is a RowError."""
        text = self._apply(messages, add_generation_prompt, tools)
        self._check_tools_rendered(text, messages, tools)
        if add_generation_prompt:
            return text, []
        spans = []
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                spans.append(self._turn_span(text, messages, i, tools, spans[-1][1] if spans else 0))
        return text, spans

    def _turn_span(self, text: str, messages: list[dict], i: int, tools: list | None, after: int) -> Span:
        prompt = self._apply(messages[:i], True, tools) if i else ""
        start = len(prompt)
        if not text.startswith(prompt):  # the turn leaves the generation prompt: from that prompt token on
            before = self._apply(messages[:i], False, tools) if i else ""
            diverge = len(os.path.commonprefix([prompt, text]))
            start = max([s for s in self._tokenize(prompt)[1] if s <= diverge] + [0])
            if not text.startswith(before) or start < len(before):
                start = -1
        whole = self._apply(messages[: i + 1], False, tools).rstrip()  # the end-of-turn token, not the separator
        n = _tail_at(text, start, whole[start:]) if start >= after and whole.startswith(text[:start]) else 0
        if not text[start:start + n].strip():
            raise RowError(f"cannot locate assistant message {i + 1} in the text the tokenizer's chat_template "
                           "renders; pass --template chatml|qwen|qwen3|llama3")
        return start, start + n

    def _check_tools_rendered(self, text: str, messages: list[dict], tools: list | None) -> None:
        """A chat_template without tool support drops tools and calls without a word; refuse instead
        (every tool's and call's name must appear in the text; results are not compared, as templates
        may re-encode them, e.g. Llama 3.1's `tojson`)."""
        names = [(t.get("function", t) or {}).get("name") for t in tools or [] if isinstance(t, dict)]
        for m in messages:
            names += [(c.get("function", c) or {}).get("name") for c in m.get("tool_calls") or []
                      if isinstance(c, dict)]
        missing = [x for x in names if isinstance(x, str) and x and x not in text]
        if missing:
            raise RowError(f"the tokenizer's chat_template does not render tools or tool calls (it "
                           f"dropped {missing[0]!r}); pass --template chatml|qwen|qwen2_5|qwen3 (the Hermes tool "
                           "layout) or a model whose chat_template renders tools")


def _tail_at(text: str, start: int, turn: str) -> int:
    """Length of the longest tail of `turn` that `text` holds at `start` (0 if none)."""
    k = 0 if start < len(text) else -1
    while 0 <= k < len(turn):
        if text.startswith(turn[k:], start):
            return len(turn) - k
        k = turn.find(text[start], k + 1)
    return 0

"""`--template jinja`: the tokenizer's own chat template, with loss spans found by prefix rendering."""
from __future__ import annotations

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
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)

    def render(self, messages: list[dict], add_generation_prompt: bool = False,
               tools: list | None = None) -> tuple[str, list[Span]]:
        text = self._apply(messages, add_generation_prompt, tools)
        self._check_tools_rendered(text, messages, tools)
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            # The assistant turn is what rendering messages[:i+1] adds after the generation prompt of messages[:i].
            before = self._apply(messages[:i], True, tools) if i else ""
            upto = self._apply(messages[: i + 1], False, tools)
            if not (upto.startswith(before) and text.startswith(upto)):
                raise SwiftError("the tokenizer's chat_template is not prefix-stable, so assistant tokens cannot be "
                                 "located; pass --template chatml|qwen|llama3")
            end = len(upto.rstrip())  # keep the end-of-turn token, drop the separator after it
            spans.append((len(before), end))
        return text, spans

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

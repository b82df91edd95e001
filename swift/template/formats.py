"""Templates written as per-role formats: chatml/qwen and llama3."""
from __future__ import annotations

from swift.template.base import TEMPLATES, RowError, Span, Template


class FormatTemplate(Template):
    """A template described by strings: `{role}` and `{content}` are filled in per message."""

    begin = ""  # text before the first message (e.g. a BOS token)
    message = ""  # a non-assistant message
    assistant_prefix = ""  # before assistant content; no loss
    assistant_end = ""  # after assistant content; gets loss (the end-of-turn token)
    assistant_sep = ""  # after the end token; no loss
    generation_prompt = ""

    def render(self, messages: list[dict], add_generation_prompt: bool = False,
               tools: list | None = None) -> tuple[str, list[Span]]:
        if tools:  # never dropped without a word
            raise RowError(f"the {self.name} template cannot render tools; use --template jinja (the tokenizer's own "
                           "chat template renders them when it supports tools)")
        parts, spans, pos = [self.begin], [], len(self.begin)
        for m in messages:
            if m["role"] == "assistant":
                head = self.assistant_prefix
                body = self.content(m) + self.assistant_end
                spans.append((pos + len(head), pos + len(head) + len(body)))
                chunk = head + body + self.assistant_sep
            else:
                chunk = self.message.format(role=m["role"], content=self.content(m))
            parts.append(chunk)
            pos += len(chunk)
        if add_generation_prompt:
            parts.append(self.generation_prompt)
        return "".join(parts), spans

    def content(self, message: dict) -> str:
        return message["content"]


@TEMPLATES.register("chatml")
class ChatMLTemplate(FormatTemplate):
    name = "chatml"
    message = "<|im_start|>{role}\n{content}<|im_end|>\n"
    assistant_prefix = "<|im_start|>assistant\n"
    assistant_end = "<|im_end|>"
    assistant_sep = "\n"
    generation_prompt = "<|im_start|>assistant\n"


@TEMPLATES.register("qwen")
class QwenTemplate(ChatMLTemplate):
    name = "qwen"
    default_system = "You are a helpful assistant."


@TEMPLATES.register("llama3")
class Llama3Template(FormatTemplate):
    name = "llama3"
    begin = "<|begin_of_text|>"
    message = "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"
    assistant_prefix = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assistant_end = "<|eot_id|>"
    generation_prompt = "<|start_header_id|>assistant<|end_header_id|>\n\n"

    def content(self, message: dict) -> str:
        return message["content"].strip()  # Meta's template trims every message

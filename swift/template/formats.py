"""Templates written as per-role formats: the ChatML family (chatml, qwen, qwen2_5, qwen3, ...) and
llama3/llama3_2. The ChatML family renders tools as Qwen2.5/Qwen3 and Hermes models are trained
on: the tool signatures in the system turn, calls in <tool_call> blocks, results in <tool_response>
blocks of a user turn."""
from __future__ import annotations

import datetime
import json

from swift.template.base import RowError, Span, Template
from swift.plugin import register
from swift.utils.registry import SwiftError

HERMES_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{signatures}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


class FormatTemplate(Template):
    """A template described by strings: `{role}` and `{content}` are filled in per message."""

    begin = ""  # text before the first message (e.g. a BOS token)
    message = ""  # a non-assistant message
    assistant_prefix = ""  # before assistant content; no loss
    assistant_end = ""  # after assistant content; gets loss (the end-of-turn token)
    assistant_sep = ""  # after the end token; no loss
    generation_prompt = ""
    renders_tools = False
    control_tokens: tuple[str, ...] = ()  # each must be one added (or special) token of the tokenizer

    def __init__(self, tokenizer, **kwargs):
        super().__init__(tokenizer, **kwargs)
        for token in self.control_tokens:  # else it is text pieces, and generation never stops at the turn's end
            if self._special_id(token) is None:
                raise SwiftError(f"--template {self.name}: {token} is not one token of this tokenizer, so the "
                                 "model was not trained on this template; pass --template jinja (the model's own) "
                                 "or its family's template")

    def render(self, messages: list[dict], add_generation_prompt: bool = False,
               tools: list | None = None) -> tuple[str, list[Span]]:
        uses_tools = bool(tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
        if uses_tools and not self.renders_tools:  # never dropped without a word
            raise RowError(f"the {self.name} template cannot render tools, tool calls or tool results; use a ChatML "
                           "family template (qwen, qwen2_5, qwen3, chatml) or --template jinja (the tokenizer's own)")
        parts, spans, pos = [self.begin], [], len(self.begin)
        if tools:
            head, messages = self.tools_turn(messages, tools)
            parts.append(head)
            pos += len(head)
        for i, m in enumerate(messages):
            head, body, tail = self.turn(messages, i)
            if m["role"] == "assistant":
                spans.append((pos + len(head), pos + len(head) + len(body)))
            chunk = head + body + tail
            parts.append(chunk)
            pos += len(chunk)
        if add_generation_prompt:
            parts.append(self.generation_prompt)
        return "".join(parts), spans

    def end_of_turn_ids(self) -> set[int]:
        """`assistant_end` when it is one control token (`<|im_end|>`, `<|eot_id|>`): a base model
        trained on this template ends its answers with it while its EOS is another token
        (`<|endoftext|>`), and a stop string cannot name a control token (decoded text leaves it out)."""
        token = self._special_id(self.assistant_end.strip()) if self.assistant_end.strip() else None
        return set() if token is None else {token}

    def _special_id(self, text: str) -> int | None:
        """The id of `text` when it is one control token of the tokenizer: a special token or an added
        one (a fine-tune's `add_tokens` marks them non-special; they are still one id)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        control = set(self.tokenizer.all_special_ids) | set(self.tokenizer.added_tokens_decoder)
        return ids[0] if len(ids) == 1 and ids[0] in control else None

    def turn(self, messages: list[dict], i: int) -> tuple[str, str, str]:
        """(text before, text with loss, text after) of message i; only an assistant's middle part has loss."""
        m = messages[i]
        if m["role"] == "assistant":
            return self.assistant_prefix, self.content(m) + self.assistant_end, self.assistant_sep
        return "", self.message.format(role=m["role"], content=self.content(m)), ""

    def tools_turn(self, messages: list[dict], tools: list) -> tuple[str, list[dict]]:
        raise NotImplementedError  # only reached when renders_tools is set

    def content(self, message: dict) -> str:
        return message["content"]


@register("template", "chatml")
class ChatMLTemplate(FormatTemplate):
    name = "chatml"
    message = "<|im_start|>{role}\n{content}<|im_end|>\n"
    assistant_prefix = "<|im_start|>assistant\n"
    assistant_end = "<|im_end|>"
    assistant_sep = "\n"
    generation_prompt = "<|im_start|>assistant\n"
    renders_tools = True
    control_tokens = ("<|im_start|>", "<|im_end|>")

    def tools_turn(self, messages: list[dict], tools: list) -> tuple[str, list[dict]]:
        """The system turn with the tool signatures (after the system prompt, when there is one)."""
        system = ""
        if messages and messages[0]["role"] == "system":
            system, messages = messages[0]["content"] + "\n\n", messages[1:]
        signatures = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
        return self.message.format(role="system", content=system + HERMES_TOOLS.replace("{signatures}", signatures)), messages

    def turn(self, messages: list[dict], i: int) -> tuple[str, str, str]:
        m = messages[i]
        if m["role"] == "tool":  # consecutive results share one user turn
            first = i == 0 or messages[i - 1]["role"] != "tool"
            last = i + 1 == len(messages) or messages[i + 1]["role"] != "tool"
            body = "\n<tool_response>\n" + _text(m["content"]) + "\n</tool_response>"
            return "", ("<|im_start|>user" if first else "") + body + ("<|im_end|>\n" if last else ""), ""
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "\n".join(_tool_call(c) for c in m["tool_calls"])
            text = (m["content"] + "\n" if m.get("content") else "") + calls
            return self.assistant_prefix, text + self.assistant_end, self.assistant_sep
        return super().turn(messages, i)


def _text(content) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def _tool_call(call: dict) -> str:
    """One call as `<tool_call>` JSON; OpenAI's `function` wrapper and JSON-string arguments are unwrapped."""
    call = call.get("function", call)
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise RowError(f"tool call {call.get('name')!r}: arguments are not JSON: {arguments[:80]!r}") from None
    return ('<tool_call>\n{"name": "' + str(call["name"]) + '", "arguments": '
            + json.dumps(arguments, ensure_ascii=False) + "}\n</tool_call>")


@register("template", "qwen")
class QwenTemplate(ChatMLTemplate):
    """Qwen1.5/Qwen2 (ms-swift's `qwen`)."""

    name = "qwen"
    default_system = "You are a helpful assistant."


@register("template", "qwen2_5")
class Qwen25Template(ChatMLTemplate):
    name = "qwen2_5"
    default_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


@register("template", "qwen2_5_math")
class Qwen25MathTemplate(ChatMLTemplate):
    name = "qwen2_5_math"
    default_system = "Please reason step by step, and put your final answer within \\boxed{}."


@register("template", "qwen3")
class Qwen3Template(ChatMLTemplate):
    """Qwen3 without a default system prompt; the model's thinking switches are not implemented.
    As Qwen3's own template does, a prompt leaves out the reasoning (up to `</think>`) of assistant
    turns before the last user query; so does training with --loss_scale last_round (as ms-swift's
    thinking templates do), while default and all train every turn as written."""

    name = "qwen3"

    def render(self, messages: list[dict], add_generation_prompt: bool = False,
               tools: list | None = None) -> tuple[str, list[Span]]:
        if add_generation_prompt or self.loss_scale == "last_round":
            messages = _without_past_reasoning(messages)
        return super().render(messages, add_generation_prompt, tools)


def _without_past_reasoning(messages: list[dict]) -> list[dict]:
    """Assistant messages before the last user query (a user message that is no tool result)
    without their `<think>...</think>`, as Qwen3's chat template renders them."""
    queries = [i for i, m in enumerate(messages) if m["role"] == "user" and isinstance(m.get("content"), str)
               and not (m["content"].startswith("<tool_response>") and m["content"].endswith("</tool_response>"))]
    last = queries[-1] if queries else -1
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if i < last and m["role"] == "assistant" and isinstance(content, str) and "</think>" in content:
            m = {**m, "content": content.split("</think>")[-1].lstrip("\n")}
        out.append(m)
    return out


@register("template", "llama3")
class Llama3Template(FormatTemplate):
    name = "llama3"
    begin = "<|begin_of_text|>"
    message = "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"
    assistant_prefix = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assistant_end = "<|eot_id|>"
    generation_prompt = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    control_tokens = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")

    def content(self, message: dict) -> str:
        return message["content"].strip()  # Meta's template trims every message


@register("template", "llama3_2")
class Llama32Template(Llama3Template):
    """Llama 3.1/3.2/3.3 chat: a system turn always, opening with the knowledge cut-off and today's date."""

    name = "llama3_2"
    date: str | None = None  # "%d %b %Y"; today when unset

    def with_system(self, messages: list[dict]) -> list[dict]:
        if messages and messages[0].get("_raw"):  # already given its header (encode_continuation → encode_prompt)
            return messages
        messages = super().with_system(messages)
        system = messages[0]["content"].strip() if messages and messages[0]["role"] == "system" else ""
        rest = messages[1:] if messages and messages[0]["role"] == "system" else messages
        date = self.date or datetime.date.today().strftime("%d %b %Y")
        header = f"Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n"
        return [{"role": "system", "content": header + system, "_raw": True}, *rest]

    def content(self, message: dict) -> str:
        return message["content"] if message.get("_raw") else super().content(message)

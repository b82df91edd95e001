"""Tool calling through `swift deploy`, in OpenAI's shapes: `tools`, `tool_choice`, assistant
messages with `tool_calls`, `tool` messages with `tool_call_id`. The chat template renders them
(ours: the Hermes layout of the ChatML family; a tokenizer's own template only where it renders
them, else the request is refused); the model's `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
blocks come back as `message.tool_calls` with `finish_reason: "tool_calls"`.

`tool_choice`: "auto" (default with tools) renders the tools and parses calls; "none" leaves the
tools out of the prompt and parses nothing; "required" starts the answer with `<tool_call>` so the
model must call one; a named function starts it with that call's name, so the model writes its
arguments."""
from __future__ import annotations

import dataclasses

import json
import re
import uuid
from dataclasses import dataclass

from swift.serving.errors import RequestError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# a call's block; the last one may be cut before its closing tag (as vLLM's Hermes parser reads it)
BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.S)


@dataclass
class ToolUse:
    """What a request asks of tools: the signatures to render, whether to parse calls, and the text
    the answer is forced to start with (the model continues it)."""

    tools: list[dict] | None = None
    parse: bool = False
    prefix: str = ""
    example: str = ""  # the prefix followed by a continuation as the model writes it (see token_aligned)
    single: bool = False  # `parallel_tool_calls: false`: at most one call per answer (the first)

    def calls_of(self, text: str) -> tuple[str | None, list[dict]]:
        """(the text outside the calls, the calls) of an answer, at most one with `single`."""
        content, calls = parse_tool_calls(text)
        return content, calls[:1] if self.single else calls

    def token_aligned(self, tokenizer) -> None:
        """Cut the forced prefix back to a token boundary of `example`: a prefix that ends inside a
        token the model writes whole (`": {"` after "arguments") would start it off the text it was
        trained on."""
        if not self.prefix:
            return
        offsets = tokenizer(self.example, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        self.prefix = self.prefix[:max((end for _, end in offsets if end <= len(self.prefix)), default=0)]


def tool_use(body: dict) -> ToolUse:
    """Read and check `tools`, `tool_choice` and `parallel_tool_calls` (400 naming the field)."""
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise RequestError("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    return dataclasses.replace(_tool_use(body), single=not parallel)


def _tool_use(body: dict) -> ToolUse:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise RequestError("'tool_choice' needs 'tools'", "tool_choice")
        return ToolUse()
    if not isinstance(tools, list):
        raise RequestError("'tools' must be a list of objects", "tools")
    names = []
    for i, t in enumerate(tools):
        function = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\", "
                               "\"description\"?, \"parameters\"?}}", "tools")
        if not isinstance(function.get("parameters", {}), dict):
            raise RequestError(f"tools[{i}].function.parameters must be a JSON Schema object", "tools")
        names.append(function["name"])
    if choice is None or choice == "auto":
        return ToolUse(tools, parse=True)
    if choice == "none":
        return ToolUse()
    if choice == "required":
        prefix = OPEN + '\n{"name": "'
        return ToolUse(tools, parse=True, prefix=prefix, example=prefix + names[0] + '", "arguments": {}}\n' + CLOSE)
    name = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise RequestError("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                           "\"function\": {\"name\": ...}}", "tool_choice")
    if name not in names:
        raise RequestError(f"'tool_choice' names {name!r}, which is not one of the tools ({', '.join(names)})",
                           "tool_choice")
    prefix = OPEN + "\n" + json.dumps({"name": name})[:-1] + ', "arguments": '
    return ToolUse(tools, parse=True, prefix=prefix, example=prefix + '{"x": 1}}\n' + CLOSE)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of an answer: every `<tool_call>` block must hold JSON with a string
    `name` and object `arguments`, else nothing is taken for a call and the text stays content (as
    vLLM's Hermes parser does)."""
    if OPEN not in text:
        return text, []
    calls = []
    for block in BLOCK.findall(text):
        try:
            call = json.loads(block)
        except json.JSONDecodeError:
            return text, []
        arguments = call.get("arguments", call.get("parameters", {})) if isinstance(call, dict) else None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(arguments, dict):
            return text, []
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}})
    if not calls:
        return text, []
    content = BLOCK.sub("", text).strip()
    return content or None, calls


def held_back(text: str) -> int:
    """How many characters at the end of `text` may be the start of `<tool_call>` (kept from a
    stream until the next piece decides)."""
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-k:]):
            return k
    return 0

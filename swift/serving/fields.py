"""Strict JSON field types, one reading for both servers: a number is never coerced from a string or
a bool, an integer field takes an integral float (JSON has one number type: `2.0` is 2) but never
`1.7`, and a flag is `true` or `false` only (`"false"` is a string). Each refusal is a 400 naming
the field."""
from __future__ import annotations

from swift.serving.errors import RequestError


def integer(value) -> int:
    """An integer, or a float with an integral value; never 1.7 → 1 (ValueError)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError
    return value


def number(body: dict, key: str, default, cast, param: str | None = None):
    """body[key] read with `cast` (`integer` or `float`), or `default` when absent or null."""
    value = body.get(key)
    if value is None:
        return default
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError
        return cast(value)
    except (TypeError, ValueError, OverflowError):
        raise RequestError(f"'{param or key}' must be {'an integer' if cast is integer else 'a number'}",
                           param or key) from None


def flag(body: dict, key: str, default: bool | None = False, param: str | None = None) -> bool | None:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"'{param or key}' must be true or false", param or key)
    return value


def strings(body: dict, key: str, param: str | None = None) -> list[str] | None:
    """A string or a list of strings (as a list), or None when absent."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise RequestError(f"'{param or key}' must be a string or a list of strings", param or key)
    return value


def checked_stop(body: dict, param: str = "stop") -> list[str]:
    """`stop` as a list of non-empty strings."""
    stop = strings(body, "stop", param) or []
    if any(not s for s in stop):
        raise RequestError(f"'{param}' strings must not be empty (an empty one would stop before the first token)",
                           param)
    return stop


ROLES = ("system", "developer", "user", "assistant", "tool")


def chat_messages(messages, param: str = "messages") -> list[dict]:
    """A non-empty list of `{role, content}` with a known role and text content (a string or a list
    of text parts, joined); an image or audio part is refused, as these models read text only.
    OpenAI's `developer` role is the system prompt of models without a role of that name."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(f"'{param}' must be a non-empty list", param)
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(f"{param}[{i}] needs a role of {', '.join(ROLES)}", param)
        content = m.get("content")
        if content is None and m["role"] == "assistant" and m.get("tool_calls"):
            content = ""  # an assistant turn that only calls tools
        if isinstance(content, list):  # [{"type": "text", "text": ...}]
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise RequestError(f"{param}[{i}].content[{j}] is a {kind!r} part; this model takes text parts "
                                       "only", param)
            content = "".join(part["text"] for part in content)
        if not isinstance(content, str):
            raise RequestError(f"{param}[{i}].content must be a string", param)
        clean.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    return clean


def tool_messages(messages: list, clean: list[dict], param: str = "messages") -> None:
    """Carry OpenAI's tool fields into the conversation: an assistant's `tool_calls` (its content
    may be null) and a tool result's `tool_call_id`; each call's arguments must be a JSON object."""
    import json

    for i, (m, out) in enumerate(zip(messages, clean)):
        calls = m.get("tool_calls")
        if calls is not None:
            if m.get("role") != "assistant" or not isinstance(calls, list):
                raise RequestError(f"{param}[{i}].tool_calls must be a list, on an assistant message", param)
            for j, c in enumerate(calls):
                function = c.get("function") if isinstance(c, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise RequestError(f"{param}[{i}].tool_calls[{j}] must be {{\"type\": \"function\", \"function\": "
                                       "{\"name\", \"arguments\"}}", param)
                arguments = function.get("arguments", "{}")
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments)
                    except json.JSONDecodeError:
                        raise RequestError(f"{param}[{i}].tool_calls[{j}].function.arguments is not JSON", param) \
                            from None
                if not isinstance(arguments, dict):
                    raise RequestError(f"{param}[{i}].tool_calls[{j}].function.arguments must be a JSON object", param)
            out["tool_calls"] = calls
        if m.get("role") == "tool" and m.get("tool_call_id") is not None:
            out["tool_call_id"] = str(m["tool_call_id"])

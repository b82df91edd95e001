"""OpenAI request bodies → (InferRequest, RequestConfig), and engine results → OpenAI response bodies."""
from __future__ import annotations

import time
import uuid
from typing import Any

from swift.infer.protocol import Choice, InferRequest, InferResponse, RequestConfig, StreamDelta, TokenLogprob
from swift.utils.registry import SwiftError


class RequestError(SwiftError):
    """A bad request; the server answers with `status` and an OpenAI-style error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


def _number(body: dict, key: str, default, cast):
    value = body.get(key)
    if value is None:
        return default
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError
        return cast(value)
    except (TypeError, ValueError, OverflowError):
        raise RequestError(f"'{key}' must be a number", key) from None


def request_config(body: dict, chat: bool) -> RequestConfig:
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError("'stop' must be a string or a list of strings", "stop")
    if chat:
        logprobs = bool(body.get("logprobs") or False)
        top = _number(body, "top_logprobs", 0, int)
    else:  # the completions API takes the number of alternatives in `logprobs`
        top = _number(body, "logprobs", None, int)
        logprobs, top = top is not None, top or 0
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    try:
        return RequestConfig(
            max_tokens=_number({"max_tokens": max_tokens}, "max_tokens", 256, int),
            temperature=_number(body, "temperature", 1.0, float),
            top_p=_number(body, "top_p", 1.0, float),
            top_k=max(_number(body, "top_k", 0, int), 0),
            repetition_penalty=_number(body, "repetition_penalty", 1.0, float),
            n=_number(body, "n", 1, int), seed=_number(body, "seed", None, int), stop=stop,
            logprobs=logprobs, top_logprobs=top)
    except RequestError:
        raise
    except SwiftError as e:
        raise RequestError(str(e), str(e).split()[0]) from None


def chat_request(body: dict, adapter: str | None) -> InferRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list", "messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise RequestError(f"messages[{i}] needs a role of system, user, assistant or tool", "messages")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}]
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string", "messages")
        clean.append({"role": m["role"], "content": content})
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise RequestError("'tools' must be a list of objects", "tools")
    return InferRequest(messages=clean, tools=tools or None, adapter=adapter)


def completion_request(body: dict, adapter: str | None) -> InferRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return InferRequest(input_ids=prompt, adapter=adapter)
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("'prompt' must be a non-empty string (or a list of token ids)", "prompt")
    return InferRequest(prompt=prompt, adapter=adapter)


def _chat_logprobs(items: list[TokenLogprob] | None) -> dict | None:
    if items is None:
        return None
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode()),
                         "top_logprobs": [{"token": s, "logprob": v, "bytes": list(s.encode())}
                                          for s, v in t.top_logprobs]} for t in items]}


def _completion_logprobs(items: list[TokenLogprob] | None) -> dict | None:
    if items is None:
        return None
    offsets, pos = [], 0
    for t in items:
        offsets.append(pos)
        pos += len(t.token)
    return {"tokens": [t.token for t in items], "token_logprobs": [t.logprob for t in items],
            "top_logprobs": [dict(t.top_logprobs) for t in items], "text_offset": offsets}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def chat_response(model: str, response: InferResponse) -> dict[str, Any]:
    return {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                         "logprobs": _chat_logprobs(c.logprobs), "finish_reason": c.finish_reason,
                         "token_ids": c.token_ids} for c in response.choices],
            "usage": response.usage}


def completion_response(model: str, response: InferResponse) -> dict[str, Any]:
    return {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": c.index, "text": c.text, "logprobs": _completion_logprobs(c.logprobs),
                         "finish_reason": c.finish_reason, "token_ids": c.token_ids} for c in response.choices],
            "usage": response.usage}


def chat_chunk(cid: str, model: str, delta: StreamDelta, first: bool) -> dict[str, Any]:
    content = {"role": "assistant", "content": delta.text} if first else {"content": delta.text}
    return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": delta.index, "delta": content, "logprobs": _chat_logprobs(delta.logprobs),
                         "finish_reason": delta.finish_reason}]}


def completion_chunk(cid: str, model: str, delta: StreamDelta) -> dict[str, Any]:
    return {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": delta.index, "text": delta.text, "logprobs": _completion_logprobs(delta.logprobs),
                         "finish_reason": delta.finish_reason}]}


__all__ = ["Choice", "RequestError", "chat_chunk", "chat_request", "chat_response", "completion_chunk",
           "completion_request", "completion_response", "new_id", "request_config"]

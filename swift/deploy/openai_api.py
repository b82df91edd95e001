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
        raise RequestError(f"'{key}' must be {'an integer' if cast is _integer else 'a number'}", key) from None


def _integer(value) -> int:
    """An integer, or a float with an integral value (JSON has one number type); never 1.7 → 1."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int):
        raise ValueError
    return value


def _flag(body: dict, key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):  # "false" is a string, not false
        raise RequestError(f"'{key}' must be true or false", key)
    return value


# OpenAI fields this server does not implement: a request that sets one to anything but its neutral
# value gets 400 naming it, rather than an answer that silently ignores it
NOT_IMPLEMENTED = {"logit_bias": lambda v: not v, "presence_penalty": lambda v: v == 0,
                   "frequency_penalty": lambda v: v == 0, "logit_bias_type": lambda v: v is None,
                   "response_format": lambda v: isinstance(v, dict) and v.get("type") == "text",
                   "tool_choice": lambda v: v in ("none", "auto"), "best_of": lambda v: v in (None, 1),
                   "suffix": lambda v: not v}


def check_fields(body: dict) -> None:
    for key, neutral in NOT_IMPLEMENTED.items():
        if body.get(key) is not None and not neutral(body[key]):
            raise RequestError(f"'{key}' is not supported by this server (only its default)", key)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false", "stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise RequestError("'stream_options' applies only when 'stream' is true", "stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage"} \
                or not isinstance(options.get("include_usage", False), bool):
            raise RequestError("'stream_options' takes {\"include_usage\": true|false} only", "stream_options")


def request_config(body: dict, chat: bool) -> RequestConfig:
    check_fields(body)
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError("'stop' must be a string or a list of strings", "stop")
    if any(not s for s in stop):
        raise RequestError("'stop' strings must not be empty (an empty one would stop before the first token)",
                           "stop")
    prompt_logprobs = None
    if chat:
        logprobs = _flag(body, "logprobs")
        top = _number(body, "top_logprobs", 0, _integer)
    else:  # the completions API takes the number of alternatives in `logprobs`
        top = _number(body, "logprobs", None, _integer)
        logprobs, top = top is not None, top or 0
        if not isinstance(body.get("echo", False), bool):
            raise RequestError("'echo' must be true or false", "echo")
        if body.get("echo") and logprobs:  # the prompt's tokens get log-probs too
            prompt_logprobs = top
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens == 0 and not chat and prompt_logprobs is None:
        prompt_logprobs = 0  # nothing to generate: the engine only reads the prompt
    try:
        return RequestConfig(
            max_tokens=_number({"max_tokens": max_tokens}, "max_tokens", 256, _integer),
            temperature=_number(body, "temperature", 1.0, float),
            top_p=_number(body, "top_p", 1.0, float),
            top_k=max(_number(body, "top_k", 0, _integer), 0),
            repetition_penalty=_number(body, "repetition_penalty", 1.0, float),
            n=_number(body, "n", 1, _integer), seed=_number(body, "seed", None, _integer), stop=stop,
            logprobs=logprobs, top_logprobs=top, prompt_logprobs=prompt_logprobs)
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
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise RequestError(f"messages[{i}] needs a role of system, developer, user, assistant or tool", "messages")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}]
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise RequestError(f"messages[{i}].content[{j}] is a {kind!r} part; this model takes text parts "
                                       "only", "messages")
            content = "".join(part["text"] for part in content)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string", "messages")
        # OpenAI's `developer` role is the system prompt of models without a role of that name
        clean.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise RequestError("'tools' must be a list of objects", "tools")
    return InferRequest(messages=clean, tools=tools or None, adapter=adapter)


def _is_ids(x) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def completion_requests(body: dict, adapter: str | None) -> list[InferRequest]:
    """`prompt` as the OpenAI API allows it: a string, a list of strings, a list of token ids, or a
    list of token-id lists; one request per prompt."""
    prompt = body.get("prompt")
    if isinstance(prompt, str) or _is_ids(prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        prompts = prompt
    else:
        raise RequestError("'prompt' must be a non-empty string, a list of strings, a list of token ids or a list of "
                           "token-id lists", "prompt")
    for i, p in enumerate(prompts):
        if isinstance(p, str) and not p:
            raise RequestError(f"prompt[{i}] is empty", "prompt")
    return [InferRequest(prompt=p, adapter=adapter) if isinstance(p, str) else InferRequest(input_ids=list(p),
                                                                                            adapter=adapter)
            for p in prompts]


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


def _echoed_logprobs(prompt: list[TokenLogprob], choice: list[TokenLogprob] | None, top: int) -> dict:
    """Completions log-probs of the prompt's tokens (the first has none) followed by the answer's."""
    items = [*prompt, *(choice or [])]
    offsets, pos = [], 0
    for t in items:
        offsets.append(pos)
        pos += len(t.token)
    return {"tokens": [t.token for t in items], "token_logprobs": [t.logprob for t in items],
            "top_logprobs": [None if t.logprob is None else dict(t.top_logprobs[:top]) for t in items],
            "text_offset": offsets}


def completion_response(model: str, responses: list[InferResponse], *, echo_texts: list[str] | None = None,
                        top: int = 0, decode=None, logprobs: bool = True) -> dict[str, Any]:
    """One response body for all prompts: choice `i·n + j` is the j-th sample of prompt i; with
    `echo_texts` each text starts with its prompt (and log-probs cover the prompt's tokens). As in
    vLLM's server, the end-of-sequence token that stopped an answer is the last log-prob entry (its
    text is not in the answer); lm-eval drops that last entry when it scores an echoed prompt. Without
    `logprobs` in the request, choices carry none (even where the engine read the prompt's)."""
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for i, response in enumerate(responses):
        prompt_tokens += response.prompt_tokens
        completion_tokens += response.completion_tokens
        for c in response.choices:
            answer = c.logprobs
            if answer is not None and c.stop_token_id is not None and c.stop_logprob is not None and decode:
                answer = [*answer, TokenLogprob(decode([c.stop_token_id]), c.stop_token_id, c.stop_logprob)]
            if not logprobs:
                items = None
            elif echo_texts is not None and response.prompt_logprobs is not None:
                items = _echoed_logprobs(response.prompt_logprobs, answer, top)
            else:
                items = _completion_logprobs(answer)
            choices.append({"index": len(choices), "text": (echo_texts[i] if echo_texts is not None else "") + c.text,
                            "logprobs": items, "finish_reason": c.finish_reason, "token_ids": c.token_ids})
    return {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                          "total_tokens": prompt_tokens + completion_tokens}}


def chat_chunk(cid: str, model: str, delta: StreamDelta, first: bool) -> dict[str, Any]:
    content = {"role": "assistant", "content": delta.text} if first else {"content": delta.text}
    return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": delta.index, "delta": content, "logprobs": _chat_logprobs(delta.logprobs),
                         "finish_reason": delta.finish_reason}]}


def usage_chunk(cid: str, model: str, chat: bool, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The last chunk of a stream with `stream_options.include_usage`: no choices, the token counts."""
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    return {"id": cid, "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [], "usage": usage}


def completion_chunk(cid: str, model: str, delta: StreamDelta) -> dict[str, Any]:
    return {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": delta.index, "text": delta.text, "logprobs": _completion_logprobs(delta.logprobs),
                         "finish_reason": delta.finish_reason}]}


__all__ = ["Choice", "RequestError", "chat_chunk", "chat_request", "chat_response", "completion_chunk",
           "completion_requests", "completion_response", "new_id", "request_config", "usage_chunk"]

"""OpenAI request bodies → (InferRequest, RequestConfig), and engine results → OpenAI response bodies."""
from __future__ import annotations

import time
import uuid
from typing import Any

from swift.deploy.tools import ToolUse
from swift.infer.protocol import Choice, InferRequest, InferResponse, RequestConfig, StreamDelta, TokenLogprob
from swift.serving.errors import RequestError
from swift.serving.fields import chat_messages, checked_stop, flag, integer, number, tool_messages
from swift.utils.registry import SwiftError


# OpenAI fields this server does not implement: a request that sets one to anything but its neutral
# value gets 400 naming it, rather than an answer that silently ignores it
NOT_IMPLEMENTED = {"logit_bias_type": lambda v: v is None,
                   "response_format": lambda v: isinstance(v, dict) and v.get("type") == "text",
                   "best_of": lambda v: v in (None, 1),
                   "suffix": lambda v: not v,
                   "min_p": lambda v: v == 0,
                   "modalities": lambda v: v == ["text"],
                   "audio": lambda v: False,
                   "reasoning_effort": lambda v: False,
                   "prediction": lambda v: False,
                   "web_search_options": lambda v: False}


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


def logit_bias(body: dict) -> dict[int, float] | None:
    """OpenAI's `logit_bias`: {"token id": bias} with string keys (JSON object keys), biases in
    [-100, 100]; token ids are checked against the vocabulary with the prompt."""
    value = body.get("logit_bias")
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise RequestError("'logit_bias' must be an object mapping token ids to numbers", "logit_bias")
    out = {}
    for key, bias in value.items():
        try:
            token = integer(int(key)) if isinstance(key, str) and key.strip().lstrip("-").isdigit() else None
        except ValueError:
            token = None
        if token is None or isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise RequestError(f"'logit_bias' entry {key!r}: keys are token ids, values numbers", "logit_bias")
        out[token] = float(bias)
    return out


def request_config(body: dict, chat: bool) -> RequestConfig:
    check_fields(body)
    stop = checked_stop(body)
    prompt_logprobs = None
    if chat:
        logprobs = flag(body, "logprobs")
        top = number(body, "top_logprobs", 0, integer)
    else:  # the completions API takes the number of alternatives in `logprobs`
        top = number(body, "logprobs", None, integer)
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
            max_tokens=number({"max_tokens": max_tokens}, "max_tokens", 256, integer),
            temperature=number(body, "temperature", 1.0, float),
            top_p=number(body, "top_p", 1.0, float),
            top_k=max(number(body, "top_k", 0, integer), 0),
            repetition_penalty=number(body, "repetition_penalty", 1.0, float),
            presence_penalty=number(body, "presence_penalty", 0.0, float),
            frequency_penalty=number(body, "frequency_penalty", 0.0, float), logit_bias=logit_bias(body),
            n=number(body, "n", 1, integer), seed=number(body, "seed", None, integer), stop=stop,
            logprobs=logprobs, top_logprobs=top, prompt_logprobs=prompt_logprobs)
    except RequestError:
        raise
    except SwiftError as e:
        raise RequestError(str(e), str(e).split()[0]) from None


def chat_request(body: dict, adapter: str | None, use: ToolUse | None = None) -> InferRequest:
    """The conversation of a chat request, with OpenAI's tool fields carried into it; `use` (from
    `tools.tool_use`) says which tools the template renders."""
    clean = chat_messages(body.get("messages"))
    tool_messages(body["messages"], clean)
    return InferRequest(messages=clean, tools=(use.tools if use else None) or None, adapter=adapter)


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


def chat_response(model: str, response: InferResponse, use: ToolUse | None = None) -> dict[str, Any]:
    choices = []
    for c in response.choices:
        message, finish = {"role": "assistant", "content": c.text}, c.finish_reason
        if use is not None and use.parse:  # the model's <tool_call> blocks become tool_calls
            content, calls = use.calls_of(use.prefix + c.text)
            if calls:  # "tool_calls" when the model ended its turn; an answer cut off stays "length"
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                finish = "tool_calls" if c.finish_reason == "stop" else c.finish_reason
            else:  # what the model wrote, the forced start of a call included
                message["content"] = use.prefix + c.text
        choices.append({"index": c.index, "message": message, "logprobs": _chat_logprobs(c.logprobs),
                        "finish_reason": finish, "token_ids": c.token_ids})
    return {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": response.usage}


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


def tool_call_chunk(cid: str, model: str, index: int, calls: list[dict]) -> dict[str, Any]:
    """A stream chunk carrying a choice's parsed tool calls (each whole: id, name and arguments)."""
    return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "delta": {"tool_calls": [{"index": k, **call} for k, call in enumerate(calls)]},
                         "logprobs": None, "finish_reason": None}]}


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
           "completion_requests", "completion_response", "new_id", "request_config", "tool_call_chunk", "usage_chunk"]

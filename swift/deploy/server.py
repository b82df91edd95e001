"""The OpenAI-compatible HTTP server of `swift deploy` (FastAPI + uvicorn)."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from swift.deploy import openai_api as api
from swift.deploy.tools import BLOCK, OPEN, ToolUse, held_back, tool_use
from swift.infer.protocol import InferRequest, RequestConfig
from swift.infer.reward import RewardScorer
from swift.infer.transformers_engine import TransformersEngine
from swift.serving.errors import RequestError, add_error_handlers, error, internal_error
from swift.serving.guard import Guard, ServingLimits, read_body, timed_out
from swift.serving.jobs import ClientGone, JobControl, JobStopped, while_client_waits
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)


class _ToolStream:
    """Per choice of a stream with tool calling: text before a `<tool_call>` streams as content (a
    possible start of one is held until the next piece), a call is kept until the choice ends and
    then sent whole, as one `tool_calls` delta, before the finish with reason `tool_calls`."""

    def __init__(self, use: ToolUse):
        self.use = use
        self.text: dict[int, str] = {}  # index -> the answer so far, forced prefix included
        self.sent: dict[int, int] = {}  # index -> characters streamed as content

    def pieces(self, cid: str, model: str, delta, first: bool) -> list[dict]:
        """The chunks for one delta."""
        i = delta.index
        text = self.text[i] = self.text.get(i, self.use.prefix) + delta.text
        sent = self.sent.get(i, 0)
        calls, finish = [], delta.finish_reason
        if finish:
            _, calls = self.use.calls_of(text[sent:])
        if calls:  # the text outside the calls, then the calls, then the finish
            piece_text = BLOCK.sub("", text[sent:]).strip()
            finish = "tool_calls" if delta.finish_reason == "stop" else delta.finish_reason
        else:
            at = text.find(OPEN, sent)
            end = len(text) if finish else (at if at >= 0 else len(text) - held_back(text))
            piece_text = text[sent:max(end, sent)]
        self.sent[i] = len(text) if calls else sent + len(piece_text)
        out = []
        piece = replace(delta, text=piece_text, finish_reason=None if calls else finish)
        if piece.text or piece.logprobs or piece.finish_reason or first:
            out.append(api.chat_chunk(cid, model, piece, first))
        if calls:
            out.append(api.tool_call_chunk(cid, model, i, calls))
            out.append(api.chat_chunk(cid, model, replace(delta, text="", token_ids=[], logprobs=None,
                                                          finish_reason=finish), False))
        return out


async def sse(engine: TransformersEngine, infer_request, config, model: str, chat: bool, timeout: float,
              include_usage: bool = False, use: ToolUse | None = None):
    """Server-sent events: one chunk per streamed piece, then `data: [DONE]`. Whatever goes wrong
    (a bad request found late, an engine error, the request timeout), the stream ends with an
    error event and `[DONE]`. `include_usage` (OpenAI's `stream_options`): every chunk carries
    `usage: null` and a last chunk without choices carries the request's token counts. With tool
    calling (`use.parse`), calls are sent as `tool_calls` deltas (`_ToolStream`)."""
    cid = api.new_id("chatcmpl" if chat else "cmpl")
    first = set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    deltas = engine.stream_async(infer_request, config)
    tools = _ToolStream(use) if chat and use is not None and use.parse else None
    completion_tokens = 0
    try:
        while True:
            try:
                delta = await asyncio.wait_for(deltas.__anext__(), max(deadline - loop.time(), 0))
            except StopAsyncIteration:
                break
            if tools is not None:
                chunks = tools.pieces(cid, model, delta, delta.index not in first)
                first.add(delta.index)
            elif chat:
                chunks = [api.chat_chunk(cid, model, delta, delta.index not in first)]
                first.add(delta.index)
            else:
                chunks = [api.completion_chunk(cid, model, delta)]
            completion_tokens += len(delta.token_ids)
            for chunk in chunks:
                if include_usage:
                    chunk["usage"] = None
                yield f"data: {json.dumps(chunk)}\n\n"
        if include_usage:
            last = api.usage_chunk(cid, model, chat, len(infer_request.input_ids), completion_tokens)
            yield f"data: {json.dumps(last)}\n\n"
    except asyncio.TimeoutError:
        yield f"data: {json.dumps(timed_out(timeout).body())}\n\n"
    except SwiftError as e:
        yield f"data: {json.dumps(RequestError(str(e)).body())}\n\n"
    except Exception as e:  # the client already has a 200: the error travels in the stream
        yield f"data: {json.dumps(internal_error('generation', e).body())}\n\n"
    finally:
        await deltas.aclose()  # frees the request's rows in the engine
    yield "data: [DONE]\n\n"


def guard_of(app: FastAPI) -> Guard:
    """The app's Guard instance (built when the app first serves)."""
    stack = app.middleware_stack
    while stack is not None and not isinstance(stack, Guard):
        stack = getattr(stack, "app", None)
    return stack


def create_app(served_model_name: str, *, engine: TransformersEngine | None = None, scorer: RewardScorer | None = None,
               adapters: dict[str, str] | None = None, limits: ServingLimits | None = None,
               log_requests: bool = True) -> FastAPI:
    """Generation routes need `engine`; reward routes need `scorer` (a seq_cls model). `log_requests`:
    one info line per request (method, path, status, time)."""
    limits = limits or ServingLimits()
    app = FastAPI(title="swift deploy")
    models = [served_model_name, *(adapters or {})]

    # key and size refusals cost no body read and no route; each request is logged in one line
    app.add_middleware(Guard, limits=limits, log_requests=log_requests)

    add_error_handlers(app, "the deploy server")

    @app.get("/health")
    async def health():
        load = engine.load() if hasattr(engine, "load") else {}
        return {"status": "ok", "requests_in_flight": guard_of(app).active, **load}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "swift"}
                                           for m in models]}

    add_generation_routes(app, engine, models, limits)
    add_reward_routes(app, scorer, served_model_name, limits)
    return app


def pick_adapter(body: dict, models: list[str]) -> str | None:
    """The adapter a request names in `model` (None: the base model, `models[0]`)."""
    model = body.get("model") or models[0]
    if model not in models:
        raise RequestError(f"model '{model}' does not exist; available: {', '.join(models)}", "model", 404,
                           "model_not_found")
    return None if model == models[0] else model


def _encode(engine: TransformersEngine, infer_request: InferRequest, prefix: str) -> list[int]:
    if not prefix:
        return engine.encode(infer_request)
    # an answer forced to start with `prefix` (tool_choice): generation continues inside it
    engine.check_text_length([m["content"] for m in infer_request.messages] + [str(infer_request.tools or "")])
    return engine.fit_prompt(engine.template.encode_continuation(
        [*infer_request.messages, {"role": "assistant", "content": prefix}], infer_request.tools,
        trusted_continuation=True))


async def prepared(engine: TransformersEngine, limits: ServingLimits, infer_request: InferRequest, body: dict,
                   config: RequestConfig, prefix: str = "") -> tuple[InferRequest, RequestConfig]:
    """The request as token ids with its answer length settled, or a RequestError: everything a
    request can get wrong is found here, before it joins a batch (tokenising runs off the loop)."""
    try:
        prompt = await asyncio.to_thread(_encode, engine, infer_request, prefix)
    except SwiftError as e:  # e.g. more text than the context can hold, found before tokenising
        raise RequestError(str(e), "messages" if infer_request.messages is not None else "prompt") from None
    except Exception as e:  # a conversation the chat template cannot render
        raise RequestError(f"the chat template cannot render this request: {type(e).__name__}: {e}",
                           "messages") from None
    if body.get("max_completion_tokens", body.get("max_tokens")) is None:  # the rest of the context
        rest = engine.max_model_len - len(prompt)
        config = replace(config, max_tokens=max(min(rest, limits.max_tokens_limit or rest), 1))
    engine.check(prompt, config)
    return InferRequest(input_ids=prompt, adapter=infer_request.adapter), config


def add_generation_routes(app: FastAPI, engine: TransformersEngine | None, models: list[str],
                          limits: ServingLimits) -> None:
    """POST /v1/chat/completions and /v1/completions (OpenAI's legacy contract: several prompts,
    token-id prompts, echo, prompt log-probs)."""

    async def complete(request: Request, chat: bool):
        try:
            if engine is None:
                raise RequestError("this server hosts a reward model (--task_type seq_cls); use POST /v1/rewards")
            body = await read_body(request)
            adapter = pick_adapter(body, models)
            use = tool_use(body) if chat else ToolUse()
            use.token_aligned(engine.tokenizer)
            infer_requests = [api.chat_request(body, adapter, use)] if chat else api.completion_requests(body, adapter)
            config = api.request_config(body, chat)
            limits.check(config, rows=config.n * len(infer_requests))
            model = body.get("model") or models[0]
            jobs = [await prepared(engine, limits, r, body, config, use.prefix) for r in infer_requests]
            if body.get("stream"):
                if len(jobs) > 1 or config.prompt_logprobs is not None or (not chat and body.get("echo")):
                    raise RequestError("streaming takes one prompt, without echo or max_tokens 0", "stream")
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return StreamingResponse(sse(engine, *jobs[0], model, chat, limits.request_timeout, include_usage,
                                             use), media_type="text/event-stream")
            work = asyncio.gather(*(engine.infer_async(r, c) for r, c in jobs))
            results = await while_client_waits(request, work, limits.request_timeout)
        except ClientGone:  # nobody reads the answer; its rows have left the batch
            return error(RequestError("the client closed the connection", status=499, code="client_closed_request"))
        except RequestError as e:
            return error(e)
        except SwiftError as e:
            return error(RequestError(str(e)))
        except asyncio.TimeoutError:
            return error(timed_out(limits.request_timeout))
        if chat:
            return api.chat_response(model, results[0], use)
        echo = [r.prompt if r.prompt is not None else engine.tokenizer.decode(r.input_ids)
                for r in infer_requests] if body.get("echo") else None
        return api.completion_response(model, results, echo_texts=echo, top=config.top_logprobs,
                                       decode=engine.tokenizer.decode, logprobs=config.logprobs)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)


def add_reward_routes(app: FastAPI, scorer: RewardScorer | None, served_model_name: str,
                      limits: ServingLimits) -> None:
    """POST /v1/rewards and OpenRLHF's POST /get_reward, answered by a seq_cls model."""

    async def rewards(request: Request, texts_of) -> list[float]:
        if scorer is None:
            raise RequestError("this server hosts a generative model; start it with --task_type seq_cls for rewards")
        texts = texts_of(scorer)
        if len(texts) > limits.max_rows_per_request:
            raise RequestError(f"{len(texts)} texts to score, above this server's limit of "
                               f"{limits.max_rows_per_request} (--max_rows_per_request)")
        # the scoring thread stops between batches once its client has left or its time is up (a thread
        # cannot be cancelled: without this it went on holding the scorer, and every later request waited)
        control = JobControl(deadline=time.time() + limits.request_timeout)
        try:
            return await while_client_waits(request, asyncio.to_thread(scorer.score, texts, control),
                                            limits.request_timeout, on_stop=control.cancelled.set)
        except ClientGone:
            raise RequestError("the client closed the connection", status=499, code="client_closed_request") from None
        except (asyncio.TimeoutError, JobStopped):
            raise timed_out(limits.request_timeout) from None
        except SwiftError as e:  # a text over --max_length under --truncation_strategy delete, before any scoring
            raise RequestError(str(e)) from None

    @app.post("/v1/rewards")
    async def v1_rewards(request: Request):
        """{"messages": [[...], ...]} or {"input": [text, ...]} -> one reward per item."""
        try:
            body = await read_body(request)
            if (body.get("model") or served_model_name) != served_model_name:
                raise RequestError(f"model '{body['model']}' does not exist; available: {served_model_name}", "model",
                                   404, "model_not_found")
            if isinstance(body.get("messages"), list) and body["messages"]:
                conversations = body["messages"]
                if isinstance(conversations[0], dict):
                    conversations = [conversations]
                requests = [api.chat_request({"messages": m}, None) for m in conversations]
                values = await rewards(request, lambda s: [s.render(r.messages) for r in requests])
            else:
                values = await rewards(request, lambda s: _texts(body, "input"))
        except RequestError as e:
            return error(e)
        return {"object": "list", "model": body.get("model") or served_model_name, "rewards": values,
                "data": [{"object": "reward", "index": i, "reward": v} for i, v in enumerate(values)]}

    @app.post("/get_reward")
    async def get_reward(request: Request):
        """OpenRLHF's remote reward model protocol: {"query": [text, ...]} -> {"rewards": [...]}."""
        try:
            body = await read_body(request)
            values = await rewards(request, lambda s: _texts(body, "query"))
        except RequestError as e:
            return error(e)
        return {"rewards": values, "scores": values}


def _texts(body: dict, key: str) -> list[str]:
    texts = body.get(key)
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise RequestError(f"'{key}' must be a non-empty list of strings", key)
    return texts

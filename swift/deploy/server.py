"""The OpenAI-compatible HTTP server of `swift deploy` (FastAPI + uvicorn)."""
from __future__ import annotations

import asyncio
import json
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from swift.deploy import openai_api as api
from swift.deploy.openai_api import RequestError
from swift.infer.reward import RewardScorer
from swift.infer.transformers_engine import TransformersEngine
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)


def error(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def read_body(request: Request) -> dict:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    return body


async def sse(engine: TransformersEngine, infer_request, config, model: str, chat: bool):
    """Server-sent events: one chunk per streamed piece, then `data: [DONE]`."""
    cid = api.new_id("chatcmpl" if chat else "cmpl")
    first = set()
    try:
        async for delta in engine.stream_async(infer_request, config):
            if chat:
                chunk = api.chat_chunk(cid, model, delta, delta.index not in first)
                first.add(delta.index)
            else:
                chunk = api.completion_chunk(cid, model, delta)
            yield f"data: {json.dumps(chunk)}\n\n"
    except SwiftError as e:
        yield f"data: {json.dumps(RequestError(str(e)).body())}\n\n"
    yield "data: [DONE]\n\n"


def create_app(served_model_name: str, *, engine: TransformersEngine | None = None, scorer: RewardScorer | None = None,
               adapters: dict[str, str] | None = None, api_key: str | None = None) -> FastAPI:
    """Generation routes need `engine`; reward routes need `scorer` (a seq_cls model)."""
    app = FastAPI(title="swift deploy")
    models = [served_model_name, *(adapters or {})]


    @app.middleware("http")
    async def guard(request: Request, call_next):
        start = time.time()
        if api_key and request.url.path != "/health" and \
                request.headers.get("authorization") != f"Bearer {api_key}":
            response = error(RequestError("invalid or missing API key", status=401, code="invalid_api_key"))
        else:
            response = await call_next(request)
        logger.info(f"{request.method} {request.url.path} {response.status_code} {1000 * (time.time() - start):.0f}ms")
        return response


    def pick_adapter(body: dict) -> str | None:
        model = body.get("model") or served_model_name
        if model not in models:
            raise RequestError(f"model '{model}' does not exist; available: {', '.join(models)}", "model", 404,
                               "model_not_found")
        return None if model == served_model_name else model

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "swift"}
                                           for m in models]}

    async def complete(request: Request, chat: bool):
        try:
            if engine is None:
                raise RequestError("this server hosts a reward model (--task_type seq_cls); use POST /v1/rewards")
            body = await read_body(request)
            adapter = pick_adapter(body)
            infer_request = api.chat_request(body, adapter) if chat else api.completion_request(body, adapter)
            config = api.request_config(body, chat)
            model = body.get("model") or served_model_name
            if body.get("stream"):
                prompt = engine.encode(infer_request)
                engine.check(prompt, config)
                return StreamingResponse(sse(engine, infer_request, config, model, chat), media_type="text/event-stream")
            result = await engine.infer_async(infer_request, config)
        except RequestError as e:
            return error(e)
        except SwiftError as e:
            return error(RequestError(str(e)))
        return api.chat_response(model, result) if chat else api.completion_response(model, result)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    add_reward_routes(app, scorer, served_model_name)
    return app


def add_reward_routes(app: FastAPI, scorer: RewardScorer | None, served_model_name: str) -> None:
    """POST /v1/rewards and OpenRLHF's POST /get_reward, answered by a seq_cls model."""

    async def rewards(texts_of) -> list[float]:
        if scorer is None:
            raise RequestError("this server hosts a generative model; start it with --task_type seq_cls for rewards")
        return await asyncio.to_thread(scorer.score, texts_of(scorer))

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
                values = await rewards(lambda s: [s.render(r.messages) for r in requests])
            else:
                values = await rewards(lambda s: _texts(body, "input"))
        except RequestError as e:
            return error(e)
        return {"object": "list", "model": body.get("model") or served_model_name, "rewards": values,
                "data": [{"object": "reward", "index": i, "reward": v} for i, v in enumerate(values)]}

    @app.post("/get_reward")
    async def get_reward(request: Request):
        """OpenRLHF's remote reward model protocol: {"query": [text, ...]} -> {"rewards": [...]}."""
        try:
            body = await read_body(request)
            values = await rewards(lambda s: _texts(body, "query"))
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

"""`swift rollout`: a generation server for RL trainers, with checked weight sync.

The HTTP process (FastAPI) owns no model. It starts `--data_parallel_size` worker processes, each
with its own InferEngine (TransformersEngine or VllmEngine), splits every request list between
them, and relays weight-sync commands. Each worker runs its commands in order, so a weight update
never overlaps a generation on that worker.

Endpoints (ms-swift's rollout protocol, plus TRL's `/generate/`): see docs/rollout.md.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import multiprocessing
import threading
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from swift.infer.protocol import RequestConfig
from swift.rollout.worker import worker_main
from swift.rollout.sync_routes import holder_gone, add_weight_sync_routes
from swift.rollout.weight_sync import NothingLoaded
from swift.serving.errors import RequestError, add_error_handlers
from swift.serving.fields import chat_messages, checked_stop, flag, integer, number, tool_messages
from swift.serving.guard import Guard, ServingLimits, read_body, timed_out
from swift.serving.jobs import ClientGone, JobStopped, while_client_waits
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)

# request_config fields a client may set, each read as the deploy server reads it
CONFIG_FIELDS = {"max_tokens": integer, "temperature": float, "top_p": float, "top_k": integer,
                 "repetition_penalty": float, "n": integer, "seed": integer, "stop": list, "logprobs": bool,
                 "top_logprobs": integer}


# -- the HTTP process ------------------------------------------------------------------------------
class WorkerHandle:
    """A worker process and the futures of the commands sent to it."""

    def __init__(self, args, rank: int, ctx):
        self.rank = rank
        self.connection, child = ctx.Pipe()
        # not a daemon: vLLM starts processes of its own; a worker exits when this pipe closes
        self.process = ctx.Process(target=worker_main, args=(args, rank, child), name=f"swift-rollout-{rank}")
        self.process.start()
        self._ids = itertools.count()
        self.ready: concurrent.futures.Future = concurrent.futures.Future()
        self._futures: dict[Any, concurrent.futures.Future] = {"ready": self.ready}
        self._send_lock = threading.Lock()
        self.alive = True
        threading.Thread(target=self._read, daemon=True, name=f"swift-rollout-reader-{rank}").start()

    def _read(self) -> None:
        while True:
            try:
                cid, err, result = self.connection.recv()
            except (EOFError, OSError):
                break
            future = self._futures.pop(cid, None)
            if future is None or future.done():  # nobody waits any more (the request timed out)
                continue
            kind, message = err if isinstance(err, tuple) else ("error", err)
            try:  # the request may be cancelled at this very moment (its client left)
                if err is None:
                    future.set_result(result)
                elif kind == "stopped":
                    future.set_exception(JobStopped(message))
                elif kind == "nothing_loaded":  # a bucket that never reached the engine (its message is ours)
                    future.set_exception(NothingLoaded(message))
                else:
                    future.set_exception(RequestError(message, status=400 if kind == "bad_request" else 500,
                                                      code=None if kind == "bad_request" else "internal_error"))
            except concurrent.futures.InvalidStateError:
                pass
        self.alive = False
        for future in list(self._futures.values()):
            try:
                future.set_exception(RuntimeError(f"rollout worker {self.rank} exited"))
            except concurrent.futures.InvalidStateError:  # cancelled meanwhile
                pass
        self._futures.clear()

    def call(self, method: str, deadline: float | None = None, **kwargs) -> concurrent.futures.Future:
        """Send a command; its future (with `.cid`, the id a cancel message names). `deadline`
        (time.time() seconds) bounds an engine job."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.cid = cid = next(self._ids)
        if not self.alive:
            future.set_exception(RuntimeError(f"rollout worker {self.rank} exited"))
            return future
        self._futures[cid] = future
        with self._send_lock:
            self.connection.send((cid, method, kwargs, deadline))
        return future

    def cancel(self, cid) -> None:
        """Stop the job `cid` (queued or running); its rows leave the batch at the next decode step."""
        if self.alive:
            try:
                with self._send_lock:
                    self.connection.send((cid, "cancel", {}, None))
            except OSError:
                pass

    def stop(self) -> None:
        if self.alive:
            try:
                with self._send_lock:
                    self.connection.send((None, "shutdown", {}, None))
            except OSError:
                pass
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.terminate()


class RolloutServer:
    """The worker pool and the communicator state behind the HTTP routes."""

    def __init__(self, args):
        self.args = args
        ctx = multiprocessing.get_context("spawn")
        self.workers = [WorkerHandle(args, rank, ctx) for rank in range(args.data_parallel_size)]
        self.info: dict = {}
        self.limits: ServingLimits = args.serving_limits
        self.communicator: dict | None = None  # {"host", "port", "token"} of the trainer that holds it
        self.communicator_lock = asyncio.Lock()
        self.sync_error: str | None = None  # why the last communicator was closed by a failure
        # a sync sent buckets and has not ended (/reset_prefix_cache/ ends one): the engines may hold a
        # mix of old and new weights. While its trainer syncs, that is the trainer's to order (as with
        # vLLM's server); once the sync is abandoned (failed, closed, or its trainer gone) nothing is
        # generated until a sync completes
        self.weights_partial = False
        self.weights_abandoned = False  # ... by a sync that will not finish: only a completed one clears it
        self.buckets_loaded = 0  # buckets that reached the engines in the sync under way

    async def check_weights(self) -> None:
        if not self.weights_partial:
            return
        c = self.communicator
        if c is not None and not self.weights_abandoned and await holder_gone(c):
            async with self.communicator_lock:
                if self.communicator is c:
                    self.communicator = None
                    self.sync_error = self.sync_error or f"the trainer at {c['host']}:{c['port']} is gone"
        if self.communicator is None:
            self.weights_abandoned = True
        if self.weights_abandoned:
            why = f" ({self.sync_error})" if self.sync_error else ""
            raise RequestError("the model holds half-updated weights: a weight sync loaded some of them and was "
                               f"abandoned{why}; a trainer must complete a sync (/reset_prefix_cache/ ends one) "
                               "before anything is generated", status=503, code="weights_partial")

    def wait_ready(self) -> None:
        infos = []
        for w in self.workers:
            try:
                infos.append(w.ready.result())
            except Exception as e:
                self.stop()
                raise SwiftError(f"rollout worker {w.rank} failed to start: {e}") from None
        self.info = infos[0]
        logger.info(f"{len(self.workers)} rollout worker(s) ready ({self.info['engine_type']}, "
                    f"{self.info['dtype']})")

    def stop(self) -> None:
        for w in self.workers:
            w.stop()

    async def all(self, method: str, **kwargs) -> list:
        return await asyncio.gather(*(asyncio.wrap_future(w.call(method, **kwargs)) for w in self.workers))

    async def job(self, request: Request, method: str, key: str, items: list, **kwargs) -> list:
        """An engine job split into contiguous shares of `items` (passed as `key`) for the workers,
        empty shares skipped; the workers' results in order. The job has the request's deadline;
        a client that leaves, or the deadline, sends every worker a cancel message, which stops its
        share between decode steps (the requests queued behind it are served on time)."""
        timeout = self.limits.request_timeout
        size = -(-len(items) // len(self.workers))
        shares = [(w, items[i * size:(i + 1) * size]) for i, w in enumerate(self.workers)]
        calls = [(w, w.call(method, deadline=time.time() + timeout, **{key: share}, **kwargs))
                 for w, share in shares if share]

        def cancel():
            for w, future in calls:
                if not future.done():
                    w.cancel(future.cid)

        try:
            return await while_client_waits(request, asyncio.gather(*(asyncio.wrap_future(f) for _, f in calls)),
                                            timeout, on_stop=cancel)
        except BaseException as e:  # one share failed (a bad row), or the job stopped: the others stop too
            cancel()
            if isinstance(e, ClientGone):
                raise RequestError("the client closed the connection", status=499,
                                   code="client_closed_request") from None
            if isinstance(e, (asyncio.TimeoutError, JobStopped)):
                raise timed_out(timeout) from None
            raise

    def fire(self, method: str, **kwargs) -> None:
        """Send to every worker without waiting; a failure closes the communicator it was sent for
        (that group is broken), never a later holder's."""
        token = (self.communicator or {}).get("token")
        for w in self.workers:
            w.call(method, **kwargs).add_done_callback(lambda f: self._on_sync_done(f, token, method))

    def _on_sync_done(self, future: concurrent.futures.Future, token: str | None, method: str) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if method == "receive":
            if not isinstance(error, NothingLoaded):  # loaded (a failure after the load counts too)
                self.buckets_loaded += 1
                self.weights_partial = True  # (another worker's NothingLoaded may have cleared it first)
            elif not self.buckets_loaded and not self.weights_abandoned:
                self.weights_partial = False  # the engines' weights are untouched
        if error is None:
            return
        logger.error(f"weight sync failed: {error}")
        if self.communicator is not None and self.communicator.get("token") == token:
            self.communicator = None
            self.sync_error = str(future.exception())
            self.weights_abandoned = self.weights_partial


def _infer_requests(requests) -> list[dict]:
    """/infer/'s `infer_requests`, checked (400 naming the first bad one): messages, data_dict, rollout_infos."""
    if not isinstance(requests, list) or not requests:
        raise RequestError("infer_requests must be a non-empty list", "infer_requests")
    clean = []
    for i, r in enumerate(requests):
        if not isinstance(r, dict):
            raise RequestError(f"infer_requests[{i}] must be an object", "infer_requests")
        messages = chat_messages(r.get("messages"), f"infer_requests[{i}].messages")
        tool_messages(r["messages"], messages, f"infer_requests[{i}].messages")
        data_dict, infos = r.get("data_dict") or {}, r.get("rollout_infos") or {}
        if not isinstance(data_dict, dict) or not isinstance(infos, dict):
            raise RequestError(f"infer_requests[{i}]: data_dict and rollout_infos must be objects", "infer_requests")
        clean.append({"messages": messages, "data_dict": data_dict, "rollout_infos": infos})
    return clean


def _config(body: dict) -> dict:
    raw = body.get("request_config") or {}
    if not isinstance(raw, dict):
        raise RequestError("request_config must be an object", "request_config")
    config = {}
    for key, kind in CONFIG_FIELDS.items():
        if raw.get(key) is None:
            continue
        param = f"request_config.{key}"
        if kind is bool:
            config[key] = flag(raw, key, param=param)
        elif kind is list:
            config[key] = checked_stop(raw, param)
        else:
            config[key] = number(raw, key, None, kind, param)
    try:
        RequestConfig(**config)
    except SwiftError as e:
        raise RequestError(f"request_config: {e}", "request_config") from None
    return config


def create_app(server: RolloutServer) -> FastAPI:
    limits = server.limits
    app = FastAPI(title="swift rollout")
    app.add_middleware(Guard, limits=limits)

    add_error_handlers(app, "the rollout server")

    @app.get("/health/")
    @app.get("/health")
    async def health():
        dead = [w.rank for w in server.workers if not w.alive]
        if dead:
            return JSONResponse(RequestError(f"rollout workers {dead} exited", status=503).body(), status_code=503)
        return {"status": "ok", "weights": "partial" if server.weights_partial else "complete"}

    @app.get("/get_world_size/")
    async def get_world_size():
        return {"world_size": len(server.workers)}

    @app.post("/get_engine_type/")
    async def get_engine_type():
        return {"engine_type": server.info["engine_type"], "enable_multi_turn": server.info["enable_multi_turn"],
                "dtype": server.info["dtype"], "data_parallel_size": len(server.workers)}

    @app.post("/infer/")
    async def infer(request: Request):
        body = await read_body(request)
        await server.check_weights()
        clean = _infer_requests(body.get("infer_requests"))
        config = _config(body)
        limits.check(RequestConfig(**config), rows=len(clean) * config.get("n", 1))
        n = config.pop("n", 1)
        limit = body.get("max_completion_length")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise RequestError("max_completion_length must be a positive integer", "max_completion_length")
        shares = await server.job(request, "infer", "requests", clean, config=config, n=n,
                                  max_completion_length=limit)
        trajectories = [t for share in shares for t in share]
        return [{"choices": trajectories[i * n:(i + 1) * n]} for i in range(len(clean))]

    @app.post("/generate/")
    async def generate(request: Request):
        body = await read_body(request)
        await server.check_weights()
        prompts = body.get("prompts")
        if not isinstance(prompts, list) or not prompts or not all(
                (isinstance(p, str) and p) or (isinstance(p, list) and p and all(
                    isinstance(t, int) and not isinstance(t, bool) for t in p)) for p in prompts):
            raise RequestError("prompts must be a non-empty list of strings or token-id lists", "prompts")
        if body.get("min_p") not in (None, 0, 0.0):
            raise RequestError("min_p is not supported by swift's engines; leave it unset or 0", "min_p")
        config = _config({"request_config": {**body, "logprobs": True}})
        cfg = RequestConfig(**config)
        limits.check(cfg, rows=len(prompts) * cfg.n)
        vocab, context = server.info["vocab_size"], server.info["max_model_len"]
        for i, p in enumerate(prompts):  # token-id prompts are checked here, text ones by the workers
            if isinstance(p, list):
                bad = next((t for t in p if not 0 <= t < vocab), None)
                if bad is not None:
                    raise RequestError(f"prompts[{i}]: token id {bad} is not in the vocabulary (0..{vocab - 1})",
                                       "prompts")
                if len(p) + cfg.max_tokens > context:
                    raise RequestError(f"prompts[{i}]: {len(p)} tokens + max_tokens {cfg.max_tokens} exceed the "
                                       f"context of {context}", "prompts")
        shares = await server.job(request, "generate", "prompts", prompts, config=config)
        return {key: [x for share in shares for x in share[key]] for key in ("prompt_ids", "completion_ids",
                                                                             "logprobs")}

    add_weight_sync_routes(app, server)
    return app

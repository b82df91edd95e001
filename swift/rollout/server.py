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
import os
import queue
import threading
import time
from dataclasses import asdict, replace
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from swift.infer.factory import build_vllm_engine, load_for_serving
from swift.infer.protocol import InferRequest, RequestConfig
from swift.infer.transformers_engine import TransformersEngine
from swift.rollout.multi_turn import RolloutInferRequest, build_scheduler
from swift.rollout.runner import rollout
from swift.rollout.sync_routes import add_weight_sync_routes
from swift.rollout.weight_sync import WeightGroup, parse_dtype, unflatten
from swift.serving.errors import RequestError, add_error_handlers, internal_error
from swift.serving.fields import chat_messages, checked_stop, flag, integer, number, tool_messages
from swift.serving.guard import Guard, ServingLimits, read_body, timed_out
from swift.serving.jobs import ClientGone, JobControl, JobStopped, while_client_waits
from swift.utils.logging import get_logger
from swift.utils.plugins import import_plugin
from swift.utils.registry import SwiftError

logger = get_logger(__name__)

# request_config fields a client may set, each read as the deploy server reads it
CONFIG_FIELDS = {"max_tokens": integer, "temperature": float, "top_p": float, "top_k": integer,
                 "repetition_penalty": float, "n": integer, "seed": integer, "stop": list, "logprobs": bool,
                 "top_logprobs": integer}


# -- the worker process ----------------------------------------------------------------------------
def _build_engine(args, rank: int):
    if args.infer_backend == "vllm":
        engine, _ = build_vllm_engine(args, worker_extension_cls="swift.infer.vllm_worker.WeightSyncExtension",
                                      processed_logprobs=True)
        return engine
    if torch.cuda.is_available() and args.data_parallel_size > 1:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    model, tokenizer, template, _ = load_for_serving(args)
    return TransformersEngine(model, tokenizer, template, max_batch_size=args.max_batch_size,
                              processed_logprobs=True)


class _Worker:
    """What one worker process does with each command."""

    def __init__(self, args, rank: int):
        for path in args.external_plugins:
            import_plugin(path)
        self.rank = rank
        self.engine = _build_engine(args, rank)
        self.scheduler = build_scheduler(args.multi_turn_scheduler, args.max_turns, env=args.gym_env)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.group: WeightGroup | None = None
        self.forming: concurrent.futures.Future | None = None  # the group of /init_communicator/, forming
        self.generation = 0  # counts communicators opened and closed

    def info(self) -> dict:
        model = getattr(self.engine, "model", None)
        if model is not None:
            dtype = next(model.parameters()).dtype
        else:
            dtype = self.engine.engine.model_config.dtype
        return {"engine_type": type(self.engine).__name__, "shapes": self.engine.weight_shapes(),
                "dtype": str(dtype).removeprefix("torch."), "enable_multi_turn": self.scheduler is not None,
                "cuda": torch.cuda.is_available(), "vocab_size": self.engine.vocab_size,
                "max_model_len": self.engine.max_model_len}

    def infer(self, requests: list[dict], config: dict, n: int, max_completion_length: int | None,
              control: JobControl | None = None) -> list[dict]:
        cfg = RequestConfig(**config)
        requests = [RolloutInferRequest(**r) for r in requests]
        first_turn = cfg if self.scheduler is None else replace(  # a multi-turn turn fits its budget
            cfg, max_tokens=min(cfg.max_tokens, max_completion_length or cfg.max_tokens))
        for i, r in enumerate(requests):  # before anything is generated
            try:
                self.engine.check_text_length([m["content"] for m in r.messages])
                self.engine.check(self.engine.template.encode_continuation(r.messages), first_turn)
                if self.scheduler is not None:
                    self.scheduler.check_request(r)
            except Exception as e:  # a conversation the template cannot render is the request's fault too
                raise SwiftError(f"infer_requests[{i}]: {e}") from None
        trajectories = rollout(self.engine, self.engine.template, requests, cfg, n,
                               scheduler=self.scheduler,
                               max_completion_length=max_completion_length or cfg.max_tokens, control=control)
        out = []
        for t in trajectories:
            d = asdict(t)
            if d["logprobs"] is not None:  # JSON has no NaN: unknown log-probs travel as null
                d["logprobs"] = [None if x != x else x for x in d["logprobs"]]
            # ms-swift's names for the same things
            d.update(message={"role": "assistant", "content": t.text}, response_token_ids=t.completion_ids,
                     response_loss_mask=t.loss_mask, finish_reason="length" if t.truncated else "stop")
            out.append(d)
        return out

    def generate(self, prompts: list, config: dict, control: JobControl | None = None) -> dict:
        requests = [InferRequest(input_ids=p) if isinstance(p, list) else InferRequest(prompt=p) for p in prompts]
        responses = self.engine.infer(requests, RequestConfig(**config), control=control)
        # as TRL's server: every sampled token, the end token included, each with its log-prob
        return {"prompt_ids": [self.engine.encode(r) for r in requests],
                "completion_ids": [c.sampled_token_ids() for r in responses for c in r.choices],
                "logprobs": [[lp.logprob for lp in c.logprobs or []] + ([c.stop_logprob] if c.stop_token_id is not None
                                                                        else []) for r in responses for c in r.choices]}

    def init_communicator(self, host: str, port: int, world_size: int, timeout: float) -> None:
        """Form the group in a thread of its own: generation goes on while the trainer joins (or
        never does); the first bucket waits for it."""
        self.close_communicator()
        forming: concurrent.futures.Future = concurrent.futures.Future()
        generation = self.generation

        def form():
            try:
                group = WeightGroup(host, port, self.rank, world_size, timeout, self.device)
            except BaseException as e:  # noqa: BLE001 - reported to the first bucket
                logger.error(f"worker {self.rank}: {e}")
                forming.set_exception(e)
                return
            if generation != self.generation:  # closed (or superseded) while it formed: never used
                group.close()
            forming.set_result(group)

        threading.Thread(target=form, daemon=True, name=f"swift-rollout-sync-{self.rank}").start()
        self.forming = forming

    def receive(self, metadatas: list[dict]) -> int:
        """One bucket: receive the flat tensor, load it into the engine, report its checksum."""
        if self.group is None and self.forming is not None:
            forming, self.forming = self.forming, None
            self.group = forming.result()  # raises what forming the group raised
        if self.group is None:
            raise RuntimeError("no communicator: the trainer must call /init_communicator/ first")
        try:
            flat = torch.empty(metadatas[-1]["end_idx"], dtype=parse_dtype(metadatas[0]["dtype"]), device=self.device)
            self.group.broadcast(flat)
            value = self.engine.load_weights(unflatten(flat, metadatas))
            self.group.gather_checksums(value)
            return value
        except Exception:
            self.group = None  # a broken group is never reused; the trainer must initialise a new one
            raise

    def close_communicator(self) -> None:
        if self.group is not None:
            self.group.close()
        self.group = self.forming = None
        self.generation += 1  # a group still forming closes itself when it forms

    def reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()


JOBS = frozenset({"infer", "generate"})  # the commands that run engine jobs (a deadline, and cancellable)


def worker_main(args, rank: int, connection) -> None:
    """Entry point of a worker process: build the engine, report ready, then serve commands in
    order. A reader thread takes messages off the pipe, so a cancel message reaches a job while it
    runs (it is checked between decode steps), and a job whose deadline passed while it waited is
    answered without running."""
    if not torch.cuda.is_available():  # share the CPU between the workers
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.data_parallel_size))
    try:
        worker = _Worker(args, rank)
        connection.send(("ready", None, worker.info()))
    except Exception as e:
        connection.send(("ready", f"{type(e).__name__}: {e}", None))
        return
    commands: queue.Queue = queue.Queue()
    controls: dict = {}  # cid -> JobControl of the jobs queued or running
    lock = threading.Lock()

    def read():
        while True:
            try:
                cid, method, kwargs, deadline = connection.recv()
            except (EOFError, OSError, KeyboardInterrupt):
                commands.put(None)
                return
            if method == "cancel":
                with lock:
                    control = controls.get(cid)
                if control is not None:
                    control.cancelled.set()
                continue
            if method in JOBS:
                with lock:
                    controls[cid] = JobControl(deadline)
            commands.put((cid, method, kwargs))
            if method == "shutdown":
                return

    threading.Thread(target=read, daemon=True, name=f"swift-rollout-pipe-{rank}").start()
    send_lock = threading.Lock()

    def answer(cid, err, result):
        with send_lock:
            connection.send((cid, err, result))

    while True:
        item = commands.get()
        if item is None or item[1] == "shutdown":
            break
        cid, method, kwargs = item
        with lock:
            control = controls.get(cid)
        try:
            if control is not None:
                control.check()  # stopped while it waited: nothing runs
                kwargs = {**kwargs, "control": control}
            answer(cid, None, getattr(worker, method)(**kwargs))
        except JobStopped as e:  # its client left or its time is up: the rows were freed
            answer(cid, ("stopped", e.reason), None)
        except SwiftError as e:  # the request's fault: the server answers 400
            answer(cid, ("bad_request", str(e)), None)
        except Exception as e:
            incident = internal_error(f"rollout worker {rank}: {method}", e)  # logged here, in full
            answer(cid, ("error", str(incident)), None)
        finally:
            with lock:
                controls.pop(cid, None)
    worker.engine.close()


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
                else:
                    future.set_exception(JobStopped(message) if kind == "stopped" else RequestError(
                        message, status=400 if kind == "bad_request" else 500,
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
            w.call(method, **kwargs).add_done_callback(lambda f: self._on_sync_done(f, token))

    def _on_sync_done(self, future: concurrent.futures.Future, token: str | None) -> None:
        if future.cancelled() or future.exception() is None:
            return
        logger.error(f"weight sync failed: {future.exception()}")
        if self.communicator is not None and self.communicator.get("token") == token:
            self.communicator = None
            self.sync_error = str(future.exception())


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
        return {"status": "ok"}

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
        requests = body.get("infer_requests")
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
                raise RequestError(f"infer_requests[{i}]: data_dict and rollout_infos must be objects",
                                   "infer_requests")
            clean.append({"messages": messages, "data_dict": data_dict, "rollout_infos": infos})
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

"""A `swift rollout` worker process: its engine and scheduler, and the loop that serves the HTTP
process's commands (a reader thread takes cancel messages off the pipe while a job runs)."""
from __future__ import annotations

import concurrent.futures
import math
import os
import queue
import threading
from dataclasses import asdict, replace

import torch

from swift.infer.factory import build_vllm_engine, load_for_serving
from swift.infer.protocol import InferRequest, RequestConfig
from swift.infer.transformers_engine import TransformersEngine
from swift.rollout.multi_turn import RolloutInferRequest, build_scheduler
from swift.rollout.runner import rollout
from swift.rollout.weight_sync import NothingLoaded, WeightGroup, parse_dtype, unflatten
from swift.serving.errors import internal_error
from swift.serving.jobs import JobControl, JobStopped
from swift.utils.logging import get_logger
from swift.plugin import load_plugins
from swift.utils.registry import SwiftError

logger = get_logger(__name__)


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
        load_plugins(args.external_plugins)  # spawned: the parent's imports are not here
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
        # the completion's budget: one answer's length when single-turn, every turn's together otherwise
        first_turn = replace(cfg, max_tokens=min(cfg.max_tokens, max_completion_length or cfg.max_tokens))
        if self.scheduler is None:
            cfg = first_turn
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
        return [as_reply(t) for t in trajectories]

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
            try:
                self.group = forming.result()
            except BaseException as e:  # what forming the group raised
                raise NothingLoaded(str(e)) from None
        if self.group is None:
            raise NothingLoaded("no communicator: the trainer must call /init_communicator/ first")
        try:
            flat = torch.empty(metadatas[-1]["end_idx"], dtype=parse_dtype(metadatas[0]["dtype"]), device=self.device)
            try:
                self.group.broadcast(flat)
            except Exception as e:
                raise NothingLoaded(str(e)) from None
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
        except NothingLoaded as e:  # a bucket that never reached the engine: its weights are untouched
            answer(cid, ("nothing_loaded", str(e)), None)
        except Exception as e:
            incident = internal_error(f"rollout worker {rank}: {method}", e)  # logged here, in full
            answer(cid, ("error", str(incident)), None)
        finally:
            with lock:
                controls.pop(cid, None)
    worker.engine.close()


def as_reply(t) -> dict:
    """A trajectory as /infer/ answers it: JSON-ready (no NaN anywhere), with ms-swift's names too."""
    d = asdict(t)
    if d["logprobs"] is not None:  # JSON has no NaN: unknown log-probs travel as null
        d["logprobs"] = [None if x != x else x for x in d["logprobs"]]
    d["rollout_infos"] = _finite(d["rollout_infos"])  # an environment's NaN or inf as well
    # ms-swift's names for the same things
    d.update(message={"role": "assistant", "content": t.text}, response_token_ids=t.completion_ids,
             response_loss_mask=t.loss_mask, finish_reason="length" if t.truncated else "stop")
    return d


def _finite(value):
    """`value` with every NaN or infinite float (in nested dicts, lists and tuples) as None: JSON has
    neither, and one such number would fail the whole reply."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value

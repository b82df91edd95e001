"""The console's chat with finished runs: one engine per run, shared by the browser tabs chatting with
that run. Each tab keeps its claim (a `Hold`) in a gr.State; an engine no tab holds is closed once its
answers in flight have ended. Before 2026-12-07 one engine served every tab: opening a run in one tab
closed the engine another tab was streaming from, and that tab's chat answered with the new run.
"""
from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass

from swift.app.chat import ChatBackend
from swift.app.runs import Run


@dataclass(frozen=True)
class Hold:
    """A browser tab's claim on the engine of run `run_id`."""

    run_id: str
    token: str


class RunEngines:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._backends: dict[str, ChatBackend] = {}
        self._holders: dict[str, set[str]] = {}  # run id -> the tokens of the holds on its engine

    def backend(self, hold: Hold | None) -> ChatBackend | None:
        """The engine a tab holds (None: it holds none)."""
        if hold is None:
            return None
        with self._lock:
            return self._backends.get(hold.run_id) if hold.token in self._holders.get(hold.run_id, ()) else None

    def hold(self, run_id: str, build: Callable[[], ChatBackend], previous: Hold | None = None) -> Hold:
        """A claim on the engine of `run_id`, built by `build` unless a tab holds one; the tab's claim
        on `previous` is given up (only once the new one is held: a build that fails leaves the tab
        as it was)."""
        token = secrets.token_hex(8)
        with self._lock:
            held = run_id in self._backends
            if held:
                self._holders[run_id].add(token)
        if not held:
            built = build()  # seconds: outside the lock
            with self._lock:
                spare = built if run_id in self._backends else None  # another tab built it meanwhile
                if spare is None:
                    self._backends[run_id], self._holders[run_id] = built, set()
                self._holders[run_id].add(token)
            if spare is not None:
                spare.retire()
        self.release(previous)
        return Hold(run_id, token)

    def release(self, hold: Hold | None) -> None:
        """Give up a claim (a tab that opened another run, or whose session ended); the last one
        retires the engine."""
        if hold is None:
            return
        with self._lock:
            holders = self._holders.get(hold.run_id)
            if holders is None or hold.token not in holders:
                return
            holders.discard(hold.token)
            if holders:
                return
            del self._holders[hold.run_id]
            backend = self._backends.pop(hold.run_id)
        backend.retire()

    def runs(self) -> list[str]:
        with self._lock:
            return list(self._backends)

    def close(self) -> None:
        with self._lock:
            backends = list(self._backends.values())
            self._backends.clear()
            self._holders.clear()
        for backend in backends:
            backend.close()


def run_backend(run: Run) -> ChatBackend:
    """An engine over a finished run's model (its result.json's model directory; a LoRA run's adapter
    on its base model), prompted with the run's own --template and --system (before 2026-11-29 the
    chat used the defaults)."""
    from swift.infer.factory import build_engine
    from swift.pipelines.app import AppArguments
    from swift.utils.registry import SwiftError

    model, adapter = run.model_dir()
    if model is None and adapter is None:
        raise SwiftError(f"{run.id} left no model (no result.json)")
    args = AppArguments(model=model, adapters=[f"{run.id}={adapter}"] if adapter else [], **run.trained_with())
    engine, adapters = build_engine(args)
    return ChatBackend(engine, adapters, name=run.id)

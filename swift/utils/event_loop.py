"""An event loop on a thread of its own, for synchronous code that drives async environments."""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import threading


class EventLoopThread:
    """One event loop on a thread of its own for environments' async code (TRL accepts async methods;
    an OpenEnv client's are; verifiers environments are async throughout), so a connection an
    environment opens stays on the loop it was opened on, from one step to the next."""

    def __init__(self):
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pid: int | None = None  # a forked child has the loop but not its thread: it starts its own

    def run(self, value, timeout: float | None = None):
        if not inspect.isawaitable(value):
            return value
        if self.loop is None or self.pid != os.getpid():
            self.loop, self.pid = asyncio.new_event_loop(), os.getpid()
            threading.Thread(target=self.loop.run_forever, name="environments", daemon=True).start()

        async def wait():
            return await value

        future = asyncio.run_coroutine_threadsafe(wait(), self.loop)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            future.cancel()
            raise TimeoutError(f"an environment method took longer than {timeout} s") from None

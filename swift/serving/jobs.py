"""The contract of an engine job, shared by both servers and the multi-turn runner: every job has
a deadline and can be cancelled, and either one frees its rows between decode steps.

- In `swift deploy` the job is an asyncio task: `while_client_waits` cancels it when its client
  disconnects or its time is up, and the engine drops its rows at the next decode step.
- In a `swift rollout` worker the job runs in another process: it carries a `JobControl` (the
  deadline, and an event the HTTP process sets with a cancel message when the client leaves or the
  request times out); the engine and the multi-turn runner poll it between steps and stop with
  `JobStopped`."""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from swift.utils.registry import SwiftError

if TYPE_CHECKING:  # engines import this module; only the servers need starlette
    from starlette.requests import Request


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


class JobStopped(SwiftError):
    """A job that ran past its deadline or was cancelled; its rows have left the batch."""

    def __init__(self, reason: str):
        super().__init__(f"the job was stopped: {reason}")
        self.reason = reason


@dataclass
class JobControl:
    """A job's deadline (`time.time()` seconds, shared by the processes of one machine) and its
    cancel flag."""

    deadline: float | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)

    def stop_reason(self) -> str | None:
        if self.cancelled.is_set():
            return "cancelled"
        if self.deadline is not None and time.time() >= self.deadline:
            return "timeout"
        return None

    def check(self) -> None:
        """Raise JobStopped when the job should stop."""
        reason = self.stop_reason()
        if reason is not None:
            raise JobStopped(reason)


POLL = 0.02  # seconds between looks at a JobControl while an engine works


async def _disconnect(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: the next ASGI message is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def while_client_waits(request: Request, work, timeout: float, on_stop=None):
    """`work`'s result; cancelled (and so its rows freed between decode steps) when the client
    disconnects (ClientGone) or after `timeout` seconds (asyncio.TimeoutError). `on_stop()` runs
    first in either case (e.g. a cancel message to the worker processes that run the job)."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler was cancelled (the Guard's cut-off, shutdown): so is the work
        if on_stop is not None:
            on_stop()
        task.cancel()
        raise
    finally:
        gone.cancel()
    if task in done:
        return task.result()
    if on_stop is not None:
        on_stop()
    task.cancel()
    try:
        await task
    except BaseException:  # its cancellation (or an error nobody will read)
        pass
    if gone in done:
        raise ClientGone
    raise asyncio.TimeoutError

"""Start `swift app` / `swift web-ui` as real processes on free loopback ports."""
from __future__ import annotations

import os
import subprocess
import time
import urllib.request

from tests.conftest import SWIFT
from tests.deploy.serving import free_port
from tests.deploy.serving import stop as stop_page  # noqa: F401 - the pages stop as the servers do


def start_page(command: str, *argv: str, timeout: float = 180, cwd: str | None = None,
               log: str | None = None) -> tuple[str, subprocess.Popen]:
    """`swift <command> --server_port P ...`, waited for until its page answers; returns (url, process).
    `log`: a file for the page's output (else it is dropped)."""
    port = free_port()
    out = open(log, "ab") if log else subprocess.DEVNULL
    try:
        proc = subprocess.Popen([*SWIFT, command, "--server_port", str(port), *argv], cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log:
            out.close()  # the process has its own copy
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return url, proc
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                stop_page(proc)
                tail = open(log, errors="replace").read()[-2000:] if log and os.path.exists(log) else ""
                raise RuntimeError(f"swift {command} did not come up: {tail}")
            time.sleep(0.5)

"""Start `swift deploy` / `swift rollout` as a real process on a free loopback port."""
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command: str, *argv: str, port: int | None = None, health: str = "/health",
          timeout: float = 180, fresh: bool = False, env: dict | None = None,
          stderr=subprocess.DEVNULL) -> tuple[str, subprocess.Popen]:
    """Launch `swift <command> --port P ...` and wait until `health` answers; returns (url, process).
    The server is forked from the worker's fork server (`tests.conftest.SWIFT`) unless `fresh`:
    a test that measures the process or kills its group needs the server itself as the process.
    `env`: the process's environment (default: this one's); `stderr`: where its log goes."""
    from tests.conftest import SWIFT

    port = port or free_port()
    swift = [sys.executable, "-m", "swift"] if fresh else SWIFT
    proc = subprocess.Popen([*swift, command, "--port", str(port), *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(base + health, timeout=1)
            return base, proc
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise RuntimeError(f"swift {command} did not come up")
            time.sleep(0.5)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextmanager
def serve(command: str, *argv: str, **kwargs):
    base, proc = start(command, *argv, **kwargs)
    try:
        yield base
    finally:
        stop(proc)


def deploy(*argv: str):
    return serve("deploy", *argv)


@contextmanager
def serve_in_thread(app):
    """Run an ASGI app with uvicorn on a free loopback port in this process; yields its base URL."""
    import threading

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024

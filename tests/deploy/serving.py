"""Start `swift deploy` as a real process on a free loopback port."""
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


@contextmanager
def deploy(*argv: str):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "swift", "deploy", "--port", str(port), *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    try:
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("swift deploy did not come up")
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)

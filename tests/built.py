"""Build expensive test inputs (trained start models) once, for every xdist worker and later runs.

`built(cache_dir, name, key, build)` returns a directory that `build(directory)` filled. The first
caller builds it under a file lock while the others wait; later callers, in this run or a later one
in the same checkout, reuse it as long as its key is the same. The key is made by `key_of` from the
code that trains it (every file of the `swift` package, the pins, the scripts named), its flags and the
environment that changes its numbers (the CPU kernel settings), so a changed file rebuilds what it
trains and nothing else. A reused directory is checked against the manifest written when it was
built: a test that wrote into it makes the next caller build it again rather than start from an
altered model.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from filelock import FileLock

ROOT = Path(__file__).resolve().parent.parent
# environment variables that change what a training run computes
KERNEL_ENV = ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")
# the pinned versions of everything a training run uses
PINS = ("pyproject.toml", "requirements/base.txt")
MANIFEST = ".built.json"


def key_of(*parts: str, files: tuple[str, ...] = ()) -> str:
    """A digest of the swift package's files, the pins, the given files (paths from the repo root),
    the given strings, the installed torch/transformers versions and the kernel settings."""
    from importlib.metadata import version

    h = hashlib.sha256()
    package = sorted(p for p in (ROOT / "swift").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in [*package, *(ROOT / f for f in (*PINS, *files))]:
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    for part in [*parts, version("torch"), version("transformers"), *(f"{k}={os.environ.get(k)}" for k in KERNEL_ENV)]:
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def _manifest(directory: Path) -> dict[str, list[int]]:
    return {str(p.relative_to(directory)): [p.stat().st_size, p.stat().st_mtime_ns]
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != MANIFEST}


def _intact(directory: Path) -> bool:
    try:
        return json.loads((directory / MANIFEST).read_text()) == _manifest(directory)
    except (OSError, ValueError):
        return False


def built(cache_dir: Path, name: str, key: str, build: Callable[[Path], None], keep: int = 2,
          wait: float = 3600) -> Path:
    """`cache_dir/name-key`, built by `build` unless an intact one is there. Of the other keys of
    `name` (older code, or other kernel settings) the newest `keep - 1` stay; a caller waits at most
    `wait` seconds for another's build."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    directory = cache_dir / f"{name}-{key}"
    if _intact(directory):
        return directory
    with FileLock(str(cache_dir / f"{name}.lock"), timeout=wait):
        if _intact(directory):  # another worker built it while this one waited
            return directory
        if directory.exists():  # an interrupted or altered build
            shutil.rmtree(directory)
        others = sorted((p for p in cache_dir.glob(f"{name}-*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
        for old in others[:max(0, len(others) - (keep - 1))]:
            shutil.rmtree(old)
        directory.mkdir()
        with _ahead_of_the_others():
            build(directory)
        (directory / MANIFEST).write_text(json.dumps(_manifest(directory)))
    return directory


@contextmanager
def _ahead_of_the_others():
    """A build is what other tests wait for (the learning checks start from the quickstart's model,
    the PPO check from the reward model) while the other workers share the same cores: where
    allowed (root, as in CI), this thread and the processes it starts run at a higher priority than
    theirs. Only the schedule changes, not what is computed. (On Linux the priority is the calling
    thread's; each worker computes on that one thread.)"""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, before - 5)
    except OSError:  # an ordinary user may not raise a priority: the build runs as the others do
        yield
        return
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


def run_ahead(argv: list[str], timeout: float | None = None, cwd=None, env=None) -> subprocess.CompletedProcess:
    """Run a build that starts its own processes (the quickstart's script) as
    `subprocess.run(argv, capture_output=True, text=True, ...)` would, but in a session of its own at a
    raised session priority.

    Linux (with autogroup scheduling, its default outside CPU cgroups) shares the CPU between
    sessions before it weighs priorities inside one: the xdist workers share pytest's session,
    while every torchrun and server a test starts in a session of its own gets a share as large as
    all of them, so a build started in the worker's session ran at a fraction of a core however
    high its own priority (the quickstart's pt stage took 84 s in a run of the suite and 24 s
    alone, 2026-12-07). The new session raises its own priority first, where the kernel and the
    user allow it; only the schedule changes. A Ctrl-C at the terminal no longer reaches the build's
    processes, so when this call is interrupted (SIGINT, SIGTERM, SIGHUP, `timeout`) their process
    group gets SIGINT, and SIGKILL if still running 3 s later or at a second interrupt."""
    # the child raises its session's priority before it execs the build (a failed write is ignored)
    wrapped = ["sh", "-c", '{ echo -5 > /proc/self/autogroup; } 2>/dev/null; exec "$@"', "sh", *argv]
    handlers = {}
    if threading.current_thread() is threading.main_thread():  # signals that would end this process quietly
        for sig in (signal.SIGTERM, signal.SIGHUP):
            handlers[sig] = signal.signal(sig, _raise_exit)
    proc = None
    try:
        proc = subprocess.Popen(wrapped, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, cwd=cwd, env=env)
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        if proc is not None:
            _stop_group(proc)
        raise
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def _stop_group(proc: subprocess.Popen, grace: float = 3) -> None:
    """SIGINT to `proc`'s process group; SIGKILL to what is left of it once its leader has ended, after
    `grace` seconds, or at an interrupt meanwhile."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=grace)  # drains its pipes and reaps the leader
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

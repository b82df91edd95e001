"""A fork server for the tests' `swift` processes: each runs as a fresh process in all that a test
can see (its own argv, environment, working directory, stdin/stdout/stderr, process group, exit
status and a normal interpreter exit), forked from a process that has imported the pipelines once,
so it starts in well under a second instead of paying ~11 s of imports (torch, transformers, peft).

    python tests/forkserver.py SOCKET      # the server (tests/conftest.py starts one per worker)
    python -S tests/forkserver.py -- ARGV  # the client, used like `python -m swift ARGV`

The client is what a test runs as its process (`tests.conftest.SWIFT`): it hands its own stdin,
stdout and stderr, its working directory and environment to the server, and ends with the exit
status of the forked `swift`. Killing the client kills that process (SIGTERM and SIGINT are passed
on; on SIGKILL the server sees the connection close). A client whose server is still importing
waits for it (up to 5 minutes): on a CPU-bound run a fresh interpreter would make the same imports
again on the same cores and start no sooner. Where the server cannot stand in for a fresh
interpreter — no server (`SWIFT_TEST_FORKSERVER` unset), or a variable that the libraries read when
they are imported differs from the server's (`IMPORT_TIME_PREFIXES`) — the client execs
`python -m swift` itself.

The server runs no torch operation before forking (its imports start no thread pool of torch's),
and where CUDA is available it does not serve at all: CUDA cannot start in a forked child. A child
dies with its watcher (PR_SET_PDEATHSIG), and a watcher that ends for any reason kills its child."""
from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

# environment variables read when torch, MKL, OpenMP or the HF libraries are imported or first used
# (not TOKENIZERS_PARALLELISM, read when tokenizers runs: transformers' `generate` sets it to "0" in
# the test worker, which would send every later client of that worker to a fresh interpreter)
IMPORT_TIME_PREFIXES = ("ATEN_", "MKL_", "OMP_", "KMP_", "TORCH", "PYTORCH", "CUDA", "HF_", "TRANSFORMERS_",
                        "PYTHON", "LD_", "DS_", "NCCL", "GLOO")
# ... but these, which torchrun sets for each rank, are read when the process group starts
RUN_TIME_PREFIXES = ("TORCHELASTIC_", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
FORKSERVER = os.path.abspath(__file__)


def _send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    payload = struct.pack("!I", len(data)) + data
    if fds:
        sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))])
    else:
        sock.sendall(payload)


def _recv(sock: socket.socket, with_fds: int = 0) -> tuple[dict | None, list[int]]:
    fds: list[int] = []
    head = b""
    while len(head) < 4:
        if with_fds and not fds:
            chunk, ancillary, _, _ = sock.recvmsg(4 - len(head), socket.CMSG_SPACE(with_fds * 4))
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.extend(struct.unpack(f"{len(data) // 4}i", data[:len(data) - len(data) % 4]))
        else:
            chunk = sock.recv(4 - len(head))
        if not chunk:
            return None, fds
        head += chunk
    (size,) = struct.unpack("!I", head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return None, fds
        body += chunk
    return json.loads(body), fds


def imported_the_same(env: dict, server: dict) -> bool:
    """Whether every import-time variable has the value in `env` that the server started with (or
    that its imports set, as the same imports would in a fresh interpreter)."""
    started, set_by_imports = server["started_with"], server["set_by_imports"]
    names = {k for k in (*env, *started) if k.startswith(IMPORT_TIME_PREFIXES) and not k.startswith(RUN_TIME_PREFIXES)}
    return all(env.get(k) == started.get(k) or (k in set_by_imports and env.get(k) == set_by_imports[k])
               for k in names)


# -- server --------------------------------------------------------------------------------------------
def _child(request: dict, fds: list[int]) -> None:
    """The forked `swift`: its own session, directory, environment and stdio, then `python -m swift`."""
    code = 1
    try:
        os.setsid()
        _die_with_parent()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.update(SET_BY_IMPORTS)  # as the imports would set them in a fresh interpreter
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.argv = ["swift", *request["argv"]]
        sys.path[0] = request["cwd"]  # as `python -m` puts the working directory first
        import importlib

        cli = importlib.import_module("swift.cli.main")
        cli.torchrun_command = _ranks_through_this_server(cli.torchrun_command)
        cli.main(request["argv"])
        code = 0
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:  # as the interpreter ends on a message
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        import traceback

        traceback.print_exc()
    if code < 0:  # ends as a fresh interpreter ends on that signal
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def _ranks_through_this_server(torchrun_command):
    """torchrun starts each rank as a client of this server (`--no-python`), so ranks are forked
    too; a rank whose import-time variables differ from the server's runs fresh, as any client."""
    def command(*args):
        line = torchrun_command(*args)
        at = line.index("swift.cli.main") - 1  # the entry: -m swift.cli.main COMMAND ARGV
        return [*line[:at], "--no-python", sys.executable, "-S", FORKSERVER, "--", *line[at + 2:]]

    return command


def _die_with_parent() -> None:
    """SIGKILL this process when its parent (the watcher) ends, however it ends (Linux)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the watcher ended before the call
        os._exit(1)


def _watch(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In a forked process per request: fork the `swift` child, pass signals from the client on to
    it, kill it if the client goes, and send back how it ended."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server's SIG_IGN would reap the child itself
    pid = os.fork()
    if pid == 0:
        conn.close()
        _child(request, fds)  # ends the process (SystemExit unwinds through the server's frames)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the child's signals come from its client
        signal.signal(signum, signal.SIG_IGN)
    try:
        _wait(conn, pid, fds)
    except BaseException:  # whatever ends the watcher ends its child
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    finally:
        os._exit(0)


def _wait(conn: socket.socket, pid: int, fds: list[int]) -> None:
    import select

    for fd in fds:
        os.close(fd)
    _send(conn, {"pid": pid})
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            _send(conn, {"status": os.waitstatus_to_exitcode(status)})
            return
        ready, _, _ = select.select([conn], [], [], 0.05)
        if ready:
            message, _ = _recv(conn)
            if message is None:  # the client was killed: so is its process (group)
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
                return
            try:  # to the process, as a signal to a fresh one reaches it alone
                os.kill(pid, message["signal"])
            except ProcessLookupError:
                pass


SET_BY_IMPORTS: dict[str, str] = {}  # variables the server's imports set (KMP_INIT_AT_FORK, ...)


def serve(path: str) -> None:
    import importlib

    started_with = dict(os.environ)
    parent = os.getppid()
    sys.path[0] = os.getcwd()  # not tests/, whose packages (data, model, eval, ...) would shadow others
    for module in ("swift.pipelines.infer", "swift.pipelines.rlhf", "swift.pipelines.train",
                   "swift.pipelines.sample", "swift.pipelines.eval", "swift.pipelines.merge_lora"):
        importlib.import_module(module)
    import gc

    import torch

    if torch.cuda.is_available():  # CUDA cannot start again in a forked child: every client runs fresh
        return
    gc.freeze()  # the imports' objects: no collector pass in a child touches (and copies) their pages
    SET_BY_IMPORTS.update({k: v for k, v in os.environ.items() if started_with.get(k) != v})
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the per-request watchers are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    with open(path + ".env.tmp", "w") as f:  # what the clients compare their environment with; its
        json.dump({"started_with": started_with, "set_by_imports": SET_BY_IMPORTS}, f)  # presence: ready
    os.replace(path + ".env.tmp", path + ".env")
    listener.settimeout(1.0)
    while True:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            if os.getppid() != parent:  # the test worker that started this server has gone
                return
            continue
        fds = []
        try:
            conn.settimeout(10)
            request, fds = _recv(conn, with_fds=3)
            conn.settimeout(None)
        except OSError:
            request = None
        if request is None or len(fds) != 3:
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            _watch(conn, request, fds)
        conn.close()
        for fd in fds:
            os.close(fd)


# -- client --------------------------------------------------------------------------------------------
def process_stat(pid: int) -> tuple[str, str]:
    """(state, start time) of a process from /proc/PID/stat: "Z" for one that ended and was not waited
    for; the start time tells it from a later process given the same pid."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return fields[0], fields[19]


def _starting(path: str) -> bool:
    """Whether the server of `path` is still importing: the process that `path.pid` names (pid and
    start time) is alive and has not written `path.env` yet."""
    try:
        with open(path + ".pid") as f:
            pid, started = f.read().split()
        state, start = process_stat(int(pid))
        return state != "Z" and start == started and not os.path.exists(path + ".env")
    except (OSError, ValueError, IndexError):
        return False


def client(argv: list[str]) -> None:
    import time

    path = os.environ.get("SWIFT_TEST_FORKSERVER")
    server_env = None
    deadline = time.monotonic() + 300
    while path and _starting(path) and time.monotonic() < deadline:  # its imports are under way: a
        time.sleep(0.1)  # fresh interpreter would do them again, on the same cores, no sooner
    if path and os.path.exists(path + ".env"):
        with open(path + ".env") as f:
            server_env = json.load(f)
    if server_env is None or not imported_the_same(dict(os.environ), server_env):
        os.execv(sys.executable, [sys.executable, "-m", "swift", *argv])
    pending: list[int] = []  # signals that arrive before the connection is up
    sock = None

    def forward(signum, _frame):
        if sock is None:
            pending.append(signum)
        else:
            _send(sock, {"signal": signum})

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:  # the server has gone: a fresh interpreter
        os.execv(sys.executable, [sys.executable, "-m", "swift", *argv])
    _send(sock, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}, [0, 1, 2])
    started, _ = _recv(sock)
    if started is None:
        sys.exit("forkserver: the server closed the connection")
    for signum in pending:
        _send(sock, {"signal": signum})
    ended, _ = _recv(sock)
    if ended is None:
        sys.exit("forkserver: the server closed the connection")
    status = ended["status"]
    if status < 0:  # killed by a signal: end the same way
        try:
            signal.signal(-status, signal.SIG_DFL)
        except OSError:  # SIGKILL and SIGSTOP keep their default
            pass
        os.kill(os.getpid(), -status)
    sys.exit(status)


if __name__ == "__main__":
    if sys.argv[1] == "--":
        client(sys.argv[2:])
    else:
        serve(sys.argv[1])

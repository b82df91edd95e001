"""Runs launched from `swift web-ui`: each one a directory under `--runs_dir`.

A run's directory holds
- `swift_run.json`: the command line, and the process id and start time of its keeper, written once
  at launch;
- `run.log`: everything the command printed;
- `swift_exit.json`: written by the keeper when the command ends (its exit code, and whether it was
  stopped);
- the command's own outputs (training runs write there: `--output_dir` is the run's directory, unless
  the form gave one: then `swift_run.json` records it, and the page looks there too).

The keeper (`python -m swift.app.runs RUN_DIR`) is a detached process in a session of its own: it runs
the command (in a session and process group of the command's own, so the keeper can kill all that is
left of it without killing itself), waits for it and records how it ended, so runs outlive the console
and a restarted console finds them from these files alone (a recorded process id counts as running
only while a process with that id and that start time exists).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

RUN_FILE, EXIT_FILE, LOG_FILE, STOP_FILE = "swift_run.json", "swift_exit.json", "run.log", "swift_stop"
# the files in a run's directory when its command starts (the console passes that directory as --output_dir)
CONSOLE_FILES = frozenset({RUN_FILE, LOG_FILE, STOP_FILE})
# seconds a stopped command gets to end after SIGTERM before it is killed
STOP_GRACE = 20.0


def not_console_files(names: list[str]) -> list[str]:
    """A directory's entries less the console's run files (and its `.swift_run.json.<pid>.tmp` while it
    replaces one): a command that writes only into an empty --output_dir takes a new run's directory."""
    tmp = tuple(f".{f}." for f in CONSOLE_FILES)
    return sorted(n for n in names if n not in CONSOLE_FILES and not n.startswith(tmp))


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _start_time(pid: int) -> float | None:
    """When process `pid` started (None: there is none, or it has ended and waits to be reaped)."""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process.create_time()
    except psutil.Error:
        return None


@dataclass
class Run:
    directory: Path
    argv: list[str]  # after `swift`
    pid: int
    pid_started: float
    started: float
    exit: dict | None
    output_dir: str | None = None  # an --output_dir the form gave (absolute), else None: the run's directory
    versioned: bool = False  # with --add_version true: the run writes to a v<N>-<time> directory in it

    @property
    def id(self) -> str:
        return self.directory.name

    @property
    def command_line(self) -> str:
        return shlex.join(["swift", *self.argv])

    @property
    def status(self) -> str:
        if self.exit is not None:
            if self.exit.get("stopped"):
                return "stopped"
            return "finished" if self.exit.get("returncode") == 0 else f"failed (exit {self.exit.get('returncode')})"
        started = _start_time(self.pid)
        if started is not None and abs(started - self.pid_started) < 1.0:
            return "stopping" if (self.directory / STOP_FILE).exists() else "running"
        return "ended without a record"  # the machine restarted, or the keeper was killed

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.directory / LOG_FILE, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(f.tell() - 64 * 1024, 0))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        # a progress bar rewrites its line with carriage returns: keep each line's last state
        shown = [next((part for part in reversed(line.split("\r")) if part.strip()), "") for line in text.split("\n")]
        return "\n".join([line for line in shown if line.strip()][-lines:])

    def places(self) -> list[Path]:
        """Where the command writes: the run's directory, and an --output_dir the form gave (with
        --add_version, the version directory the run's log names: `this run writes to ...`; before
        2026-12-07 the page looked in the run's directory only, and found nothing of such a run)."""
        if not self.output_dir:
            return [self.directory]
        if not self.versioned:
            return [self.directory, Path(self.output_dir)]
        version = _logged_version(self.directory)
        return [self.directory] + ([Path(self.output_dir) / version] if version else [])

    def logging_file(self) -> Path | None:
        """The newest logging.jsonl the command wrote (a checkpoint deleted while this looks is
        skipped)."""
        return _newest(self.places(), "logging.jsonl")

    def metrics(self) -> list[dict]:
        path = self.logging_file()
        if path is None:
            return []
        rows = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass  # the line being written
        return rows

    def progress(self) -> str:
        rows = [r for r in self.metrics() if "global_step" in r]
        if not rows:
            return ""
        step, total = rows[-1]["global_step"], rows[-1].get("max_steps") or 0
        return f"step {step}/{total} ({100 * step / total:.0f}%)" if total else f"step {step}"

    def model_dir(self) -> tuple[str | None, str | None]:
        """(model, adapter) a finished training run left: its result.json's model directory, an
        adapter directory when it holds adapter_config.json."""
        found = _newest(self.places(), "result.json")
        if found is None:
            return None, None
        model = (_read_json(found) or {}).get("model_dir") or str(found.parent)
        if os.path.isfile(os.path.join(model, "adapter_config.json")):
            return None, model
        return model, None

    def trained_with(self) -> dict:
        """--template and --system of the training run (its args.json beside result.json), so the chat
        prompts the model as it was trained (those given; an unset one is chosen as usual)."""
        found = _newest(self.places(), "result.json")
        recorded = (_read_json(found.parent / "args.json") or {}) if found is not None else {}
        return {k: recorded[k] for k in ("template", "system") if recorded.get(k) is not None}


# the line `swift pt|sft|rlhf` logs once it has claimed its version directory (swift/pipelines/train.py)
VERSION_LINE = re.compile(rb"this run writes to [^\n]*?[/\\](v\d+-\d{8}-\d{6})\r?\n")
_VERSIONS: dict[Path, str] = {}  # run directory -> the version directory its log named (it never changes)


def _logged_version(directory: Path) -> str | None:
    if directory not in _VERSIONS:
        try:
            with open(directory / LOG_FILE, "rb") as f:
                found = VERSION_LINE.search(f.read(4 << 20))  # logged before training starts
        except OSError:
            return None
        if found is None:
            return None
        _VERSIONS[directory] = found.group(1).decode()
    return _VERSIONS[directory]


def _newest(directories: list[Path], name: str) -> Path | None:
    """The most recently written file of that name under `directories`, at most 3 levels down."""
    best, best_time = None, -1.0
    for directory in directories:
        for depth in range(4):
            for path in directory.glob("/".join(["*"] * depth + [name])):
                try:
                    mtime = path.stat().st_mtime
                except OSError:  # removed meanwhile
                    continue
                if mtime > best_time:
                    best, best_time = path, mtime
    return best


def load_run(directory: Path) -> Run | None:
    info = _read_json(directory / RUN_FILE)
    if not info:
        return None
    return Run(directory, info["argv"], info["pid"], info["pid_started"], info["started"],
               _read_json(directory / EXIT_FILE), info.get("output_dir"), bool(info.get("versioned")))


def list_runs(runs_dir: str) -> list[Run]:
    """Every run under `runs_dir`, newest first."""
    root = Path(runs_dir)
    runs = [load_run(d) for d in root.iterdir() if d.is_dir()] if root.is_dir() else []
    return sorted((r for r in runs if r is not None), key=lambda r: r.started, reverse=True)


def new_run_dir(runs_dir: str, command: str) -> Path:
    """`<runs_dir>/<command>-<YYYYmmdd-HHMMSS>[-N]`, created here (never one that exists)."""
    base = Path(runs_dir) / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(1000):
        path = base if n == 0 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"no free run directory beside {base}")


def launch(directory: Path, argv: list[str], output_dir: str | None = None, versioned: bool = False) -> Run:
    """Start `swift <argv>` detached, kept by a keeper process, in `directory`. `output_dir`: where the
    command writes when the form named another directory (`versioned`: in a v<N>-<time> directory
    there)."""
    keeper = subprocess.Popen([sys.executable, "-m", "swift.app.runs", str(directory)], start_new_session=True,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "SWIFT_RUN_ARGV": json.dumps(argv)})  # relative paths: as typed here
    _KEEPERS.append(keeper)  # reaped by `reap` (a restarted console is not their parent, and need not be)
    started = _start_time(keeper.pid) or time.time()
    _write_json(directory / RUN_FILE, {"argv": argv, "pid": keeper.pid, "pid_started": started,
                                       "started": time.time(), "cwd": os.getcwd(),
                                       **({"output_dir": output_dir, "versioned": versioned} if output_dir else {})})
    return load_run(directory)


_KEEPERS: list[subprocess.Popen] = []


def reap() -> None:
    for keeper in list(_KEEPERS):
        if keeper.poll() is not None:
            _KEEPERS.remove(keeper)


def stop(run: Run) -> None:
    """Ask a running run to end: SIGTERM to its keeper, which passes it to the command's process group
    (the command and its workers); the keeper kills what is left once the command has ended, or
    after STOP_GRACE seconds, and records the run as stopped."""
    if run.status != "running":
        return
    (run.directory / STOP_FILE).write_text(str(time.time()))
    try:
        os.killpg(run.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


LAUNCH_VARIABLES = ("NPROC_PER_NODE", "NNODES", "NODE_RANK")


def command_env(command: str, env) -> dict[str, str]:
    """A run's environment: the console's, less the launcher's rank variables for a command that
    runs one process (the console's NPROC_PER_NODE is for its training runs; before 2026-12-07 an
    infer/eval/export run from such a console was refused by the CLI after "launched")."""
    from swift.cli.main import DISTRIBUTED_COMMANDS

    out = {**env, "PYTHONUNBUFFERED": "1"}
    if command not in DISTRIBUTED_COMMANDS:
        for name in LAUNCH_VARIABLES:
            out.pop(name, None)
    return out


def keep(directory: Path) -> int:
    """The keeper: run the command, record how it ended."""
    argv = json.loads(os.environ.pop("SWIFT_RUN_ARGV"))
    stopping: list[float] = []
    group: list[int] = []  # the command's process group, once it is started
    seen: list = []  # the processes below the keeper when the stop came

    def on_stop(*_) -> None:
        stopping.append(time.time())
        seen.extend(_below())
        _signal_group(group, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_stop)
    with open(directory / LOG_FILE, "ab") as log:
        child = subprocess.Popen([sys.executable, "-m", "swift.cli.main", *argv], stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                 env=command_env(argv[0], os.environ))
        group.append(child.pid)
        if stopping:  # the stop came before the command started
            _signal_group(group, signal.SIGTERM)
        while True:
            try:
                code = child.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if stopping and time.time() - stopping[0] > STOP_GRACE:
                    _kill_run(group, seen)
    if stopping:
        _kill_run(group, seen)  # workers (torchrun's ranks, engine processes) that outlived the command
    _write_json(directory / EXIT_FILE, {"returncode": code, "stopped": bool(stopping) or
                                        (directory / STOP_FILE).exists(), "ended": time.time()})
    return 0


def _below() -> list:
    import psutil

    return psutil.Process().children(recursive=True)


def _signal_group(group: list[int], sig: int) -> None:
    for pgid in group:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # nothing left in it


def _kill_run(group: list[int], seen: list) -> None:
    """SIGKILL to what is left of the run: the command's process group (a worker that outlived the
    command was reparented to PID 1, so only its group still finds it; before 2026-11-29 such a worker
    survived a stop), every process still below the keeper, and those below it when the stop came (a
    worker in a session of its own, as torchrun's ranks)."""
    import psutil

    _signal_group(group, signal.SIGKILL)
    for process in [*_below(), *seen]:
        try:
            process.kill()  # psutil refuses a process id reused since it was seen
        except psutil.Error:
            pass


if __name__ == "__main__":
    raise SystemExit(keep(Path(sys.argv[1])))

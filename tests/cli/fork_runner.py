"""Run many `swift <command> ...` lines as separate processes without paying the imports each time:
this process imports the pipelines once (before torch has run anything, so no kernel thread pool
exists yet) and forks a child per line, "jobs" at a time. A child is a fresh `swift` process in all
that matters here: its own argv, working state, stdin from /dev/null, stdout and stderr in files,
its own exit status, a normal interpreter exit.

    python tests/cli/fork_runner.py JOBS.json  ->  writes JOBS.json.out: [{"returncode", "stdout", "stderr"}]

JOBS.json: {"jobs": 2, "lines": [[command, argv...], ...], "dirs": [log dir per line]}."""
import importlib
import json
import os
import signal
import sys


def child(line: list[str], logs: str) -> None:
    """Run one line in this forked process and end it as `python -m swift` ends: a normal interpreter
    exit (atexit handlers run, threads are joined), killed by SIGALRM after 600 s."""
    code = 1
    try:
        signal.alarm(600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.dup2(os.open(os.path.join(logs, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        sys.argv = ["swift", *line]
        from swift.cli.main import main

        main(line)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    sys.exit(code)  # unwinds out of the parent's loop below and ends this process


def main() -> None:
    path = sys.argv[1]
    with open(path) as f:
        spec = json.load(f)
    # what every line needs, imported once here and inherited by each fork
    for module in ("swift.pipelines.infer", "swift.pipelines.rlhf", "swift.pipelines.train"):
        importlib.import_module(module)

    pending, running, status = list(range(len(spec["lines"]))), {}, {}
    while pending or running:
        while pending and len(running) < spec["jobs"]:
            i = pending.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                child(spec["lines"][i], spec["dirs"][i])
            running[pid] = i
        pid, raw = os.wait()
        status[running.pop(pid)] = os.waitstatus_to_exitcode(raw)
    results = []
    for i, logs in enumerate(spec["dirs"]):
        out = {"returncode": status[i]}
        for name in ("stdout", "stderr"):
            with open(os.path.join(logs, name), errors="replace") as f:
                out[name] = f.read()
        results.append(out)
    with open(path + ".out", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()

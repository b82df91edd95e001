"""The web console's run keeper (`swift.app.runs`): a stopped run leaves no process behind."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from swift.app import runs as R

psutil = pytest.importorskip("psutil")

# a command's worker that ignores SIGTERM (busy in a C call, or with a handler of its own)
PLUGIN = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c",
                           "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
open({pid_file!r}, "w").write(str(worker.pid))
time.sleep(600)
"""


def wait_until(condition, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def gone(process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE  # killed; its new parent has not reaped it yet
    except psutil.NoSuchProcess:
        return True


def test_stop_kills_a_worker_that_ignores_sigterm_after_the_command_ended(tmp_path):
    """The command ends on SIGTERM; its worker, reparented to PID 1, is killed with the command's process
    group (before 2026-11-29 it outlived a run shown as stopped)."""
    pid_file = tmp_path / "worker.pid"
    plugin = tmp_path / "spawn_worker.py"
    plugin.write_text(PLUGIN.format(pid_file=str(pid_file)))
    run_dir = R.new_run_dir(str(tmp_path / "runs"), "infer")
    run = R.launch(run_dir, ["infer", "--model", "builtin:tiny-chat", "--external_plugins", str(plugin)])
    worker = None
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text(), 120, "the command's worker")
        worker = psutil.Process(int(pid_file.read_text()))
        R.stop(run)
        # well before STOP_GRACE: the command ended on SIGTERM, and nothing was left to wait for
        wait_until(lambda: (run_dir / R.EXIT_FILE).exists(), R.STOP_GRACE - 5, "the keeper's exit record")
        assert json.loads((run_dir / R.EXIT_FILE).read_text())["stopped"]
        wait_until(lambda: gone(worker), 5, "the worker to be killed")
    finally:
        if worker is not None and not gone(worker):
            os.kill(worker.pid, signal.SIGKILL)
        R.reap()


def test_the_chat_of_a_finished_run_gets_the_template_and_system_it_was_trained_with(tmp_path):
    """`open_chat` builds its engine with these (before 2026-11-29 the chat prompted a model trained
    with --system/--template under the defaults)."""
    out = tmp_path / "v0-20261129-000000"
    out.mkdir()
    (out / "result.json").write_text(json.dumps({"model_dir": str(out)}))
    (out / "args.json").write_text(json.dumps({"template": "chatml", "system": "You are a calculator.",
                                               "model": "builtin:tiny-chat"}))
    run = R.Run(directory=tmp_path, argv=["sft"], pid=0, pid_started=0.0, started=0.0, exit={"returncode": 0})
    assert run.trained_with() == {"template": "chatml", "system": "You are a calculator."}
    (out / "args.json").write_text(json.dumps({"template": None, "system": None}))
    assert run.trained_with() == {}


def test_export_from_the_console_writes_into_its_run_directory(tmp_path):
    """`swift export` launched as the console launches it: into the run's directory, beside the
    keeper's swift_run.json and run.log (before 2026-12-07 every export from the console was refused
    there: "--output_dir ... already has files")."""
    from swift.app.console import check, launchable, with_outputs

    export = launchable()["export"]
    run_dir = R.new_run_dir(str(tmp_path / "runs"), "export")
    argv = with_outputs(export, ["--model", "builtin:tiny-chat", "--to_cached_dataset", "true", "--dataset",
                                 "builtin:arith-sft#8"], str(run_dir))
    check("export", export, argv)
    R.launch(run_dir, ["export", *argv])
    try:
        wait_until(lambda: (run_dir / R.EXIT_FILE).exists(), 300, "the export to end")
    finally:
        R.reap()
    log = (run_dir / R.LOG_FILE).read_text(errors="replace")
    assert json.loads((run_dir / R.EXIT_FILE).read_text())["returncode"] == 0, log[-2000:]
    assert (run_dir / "train").is_dir() and (run_dir / R.RUN_FILE).exists()


def test_one_process_commands_run_without_the_consoles_rank_variables():
    """`NPROC_PER_NODE=2 swift web-ui`: training runs keep it, the others run without it (before
    2026-12-07 they inherited it and the CLI refused them after the page said "launched")."""
    env = {"NPROC_PER_NODE": "2", "NNODES": "1", "NODE_RANK": "0", "PATH": "/bin"}
    assert {k: R.command_env("sft", env)[k] for k in R.LAUNCH_VARIABLES} == {"NPROC_PER_NODE": "2", "NNODES": "1",
                                                                          "NODE_RANK": "0"}
    for command in ("infer", "eval", "export", "merge-lora", "sample"):
        assert not set(R.LAUNCH_VARIABLES) & set(R.command_env(command, env)), command
    assert R.command_env("infer", env)["PATH"] == "/bin"

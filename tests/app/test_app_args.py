"""`swift app` / `swift web-ui` without a browser: their flags, the console's run records and helpers."""
from __future__ import annotations

import json
import logging
import os
import subprocess

import pytest

from swift.app import runs as R
from swift.app.console import find_run, launchable, with_outputs
from swift.app.i18n import LABELS
from swift.pipelines import app as P
from swift.utils.registry import SwiftError
from tests.conftest import SWIFT
from tests.deploy.serving import free_port


def swift(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SWIFT, *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv, message", [
    (["app"], "swift app needs --model (or --adapters), or --base_url"),
    (["app", "--base_url", "http://127.0.0.1:9/v1", "--adapters", "x"], "--adapters does nothing with --base_url"),
    (["app", "--model", "builtin:tiny-chat", "--lang", "fr"], "--lang 'fr' is not one of en, zh"),
    (["web-ui", "--auth", "nopassword"], "--auth: expected user:password"),
    (["web-ui", "--share", "true"], "--share publishes the console, which runs commands as this user"),
    (["web-ui", "--server_name", "0.0.0.0"], "--server_name 0.0.0.0 opens the console, which runs commands"),
    (["app", "--base_url", "http://127.0.0.1:9/v1", "--torch_dtype", "float16"], "--torch_dtype does nothing with --base_url"),
    (["app", "--base_url", "http://127.0.0.1:9/v1", "--max_batch_size", "4"], "--max_batch_size does nothing with --base_url"),
    (["app", "--model", "builtin:tiny-chat", "--api_key", "k"], "--api_key is the key of --base_url"),
    (["app", "--model", "builtin:tiny-chat", "--loss_scale", "all"], "--loss_scale applies to training"),
    (["app", "--model", "builtin:tiny-chat", "--task_type", "seq_cls"], "--task_type seq_cls: the chat page generates"),
])
def test_bad_flags_are_one_line(argv, message):
    out = swift(*argv)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"swift {argv[0]}: error: {message}"), out.stderr


def test_share_is_refused_where_gradios_share_server_is_unreachable(monkeypatch):
    monkeypatch.setattr(P, "SHARE_SERVER", ("127.0.0.1", free_port()))  # nothing listens: as offline
    with pytest.raises(SwiftError, match="--share: gradio's share server 127.0.0.1 cannot be reached"):
        P.check_share(True)
    P.check_share(False)


def test_auth_from_a_file_and_the_warning_for_an_open_address(tmp_path):
    key = tmp_path / "auth.txt"
    key.write_text("ada:s3cret\n")
    assert P.WebUIArguments(auth_file=str(key)).console_args.credentials() == ("ada", "s3cret")
    with pytest.raises(SwiftError, match="give one"):
        P.WebUIArguments(auth="a:b", auth_file=str(key))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("swift")
    logger.addHandler(handler)
    try:
        P._warn_if_open("127.0.0.1", False, "swift app")
        P._warn_if_open("0.0.0.0", True, "swift app")
        assert records == []
        P._warn_if_open("0.0.0.0", False, "swift app")
        assert len(records) == 1 and "binds 0.0.0.0 without --auth" in records[0].getMessage()
    finally:
        logger.removeHandler(handler)


def test_every_label_in_both_languages():
    for key, (en, zh) in LABELS.items():
        assert en.strip() and zh.strip(), key
    assert sum(en != zh for en, zh in LABELS.values()) >= len(LABELS) - 2  # only names such as Top-p are kept


def test_every_batch_command_gets_a_form_and_no_server_does():
    forms = launchable()
    assert {"pt", "sft", "rlhf", "infer", "eval", "sample", "merge-lora"} <= set(forms)
    assert not {"deploy", "rollout", "app", "web-ui"} & set(forms)


def test_outputs_go_to_the_run_unless_the_form_says_otherwise():
    sft = launchable()["sft"]
    assert with_outputs(sft, ["--model", "m"], "/r") == ["--model", "m", "--output_dir", "/r", "--add_version", "false"]
    assert with_outputs(sft, ["--output_dir", "/mine"], "/r") == ["--output_dir", "/mine", "--add_version", "false"]
    assert with_outputs(launchable()["infer"], [], "/r") == ["--result_path", "/r/infer_result.jsonl"]


def test_a_run_is_running_only_while_its_recorded_process_lives(tmp_path):
    runs = tmp_path / "runs"
    run_dir = R.new_run_dir(str(runs), "sft")
    assert R.new_run_dir(str(runs), "sft") != run_dir  # never a directory that exists
    me = os.getpid()
    started = R._start_time(me)
    record = {"argv": ["sft"], "pid": me, "pid_started": started, "started": 1.0}
    (run_dir / R.RUN_FILE).write_text(json.dumps(record))
    assert R.load_run(run_dir).status == "running"
    # the same process id, started at another time: a reused id, not the run
    (run_dir / R.RUN_FILE).write_text(json.dumps({**record, "pid_started": started - 100}))
    assert R.load_run(run_dir).status == "ended without a record"
    (run_dir / R.EXIT_FILE).write_text(json.dumps({"returncode": 3, "stopped": False}))
    assert R.load_run(run_dir).status == "failed (exit 3)"


def test_a_page_cannot_name_a_run_outside_the_runs_dir(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / R.RUN_FILE).write_text(json.dumps({"argv": [], "pid": 1, "pid_started": 0, "started": 0}))
    for name in ("../elsewhere", str(outside), "..", "a/../../elsewhere"):
        assert find_run(str(runs), name) is None


def test_base_url_reads_model_and_system():
    a = P.AppArguments(base_url="http://127.0.0.1:9/v1", model="arith", system="be brief")
    assert (a.model, a.system) == ("arith", "be brief")


def test_the_console_check_never_ends_the_console_nor_leaves_environment_behind(monkeypatch):
    from swift.app.console import check

    sft = launchable()["sft"]
    for flag in ("-h", "--help"):
        with pytest.raises(SwiftError, match="run `swift sft --help` in a shell"):
            check("sft", sft, ["--model", "m", flag])
    before = dict(os.environ)
    check("sft", sft, ["--model", "builtin:tiny-chat", "--dataset", "d", "--fsdp", "fsdp2"])  # sets FSDP_* variables
    assert dict(os.environ) == before

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
        # a public link on loopback too (before 2026-12-07 no warning)
        P._warn_if_open("127.0.0.1", False, "swift app", "chat with the model", share=True)
        assert len(records) == 2 and records[1].getMessage() == (
            "swift app --share publishes a gradio.live link with no password: anyone who has the link can chat "
            "with the model")
    finally:
        logger.removeHandler(handler)


def test_every_label_in_both_languages():
    for key, (en, zh) in LABELS.items():
        assert en.strip() and zh.strip(), key
    assert sum(en != zh for en, zh in LABELS.values()) >= len(LABELS) - 2  # only names such as Top-p are kept


def test_every_batch_command_gets_a_form_and_no_server_does():
    forms = launchable()
    assert {"pt", "sft", "rlhf", "infer", "eval", "sample", "merge-lora", "export"} <= set(forms)
    assert not {"deploy", "rollout", "app", "web-ui"} & set(forms)


def test_outputs_go_to_the_run_unless_the_form_says_otherwise():
    forms = launchable()
    sft, infer, export = forms["sft"], forms["infer"], forms["export"]
    assert with_outputs(sft, ["--model", "m"], "/r") == ["--model", "m", "--output_dir", "/r", "--add_version", "false"]
    # the user's own --output_dir versions as on the command line (before 2026-12-07 --add_version false
    # there too, so runs into one directory overwrote each other)
    assert with_outputs(sft, ["--output_dir", "/mine"], "/r") == ["--output_dir", "/mine"]
    assert with_outputs(sft, ["--add_version", "true"], "/r") == ["--add_version", "true", "--output_dir", "/r"]
    # --result_path only in batch mode (before 2026-12-07 always: the CLI had to accept it alone)
    assert with_outputs(infer, [], "/r") == []
    assert with_outputs(infer, ["--val_dataset", "d"], "/r") == ["--val_dataset", "d", "--result_path",
                                                                  "/r/infer_result.jsonl"]
    # swift export: the run's directory, but not for --push_to_hub alone, which uploads a folder as it is
    assert with_outputs(export, ["--merge_lora", "true"], "/r") == ["--merge_lora", "true", "--output_dir", "/r"]
    assert with_outputs(export, ["--push_to_hub", "true", "--model", "m"], "/r") == ["--push_to_hub", "true",
                                                                                       "--model", "m"]
    assert with_outputs(export, ["--push_to_hub", "true", "--to_gguf", "true"], "/r")[-2:] == ["--output_dir", "/r"]


def test_result_path_without_val_dataset_is_refused():
    """`swift infer --result_path` alone wrote nothing and said nothing before 2026-12-07."""
    from swift.pipelines.infer import InferArguments

    with pytest.raises(SwiftError, match="^--result_path applies to batch mode only: give --val_dataset"):
        InferArguments(model="builtin:tiny-chat", result_path="out.jsonl")
    InferArguments(model="builtin:tiny-chat", result_path="out.jsonl", val_dataset=["builtin:arith-sft#2"])


def test_export_push_to_hub_alone_passes_the_consoles_check(tmp_path):
    """The console's export form with --push_to_hub alone (before 2026-12-07 refused: the console added
    --output_dir, which an upload as it is does not read)."""
    from swift.app.console import check

    export = launchable()["export"]
    folder = tmp_path / "model"
    folder.mkdir()
    run_dir = R.new_run_dir(str(tmp_path / "runs"), "export")
    argv = with_outputs(export, ["--model", str(folder), "--push_to_hub", "true", "--hub_model_id", "me/x"],
                        str(run_dir))
    assert check("export", export, argv).options.uploads_as_is


def test_the_runs_page_finds_a_run_written_to_the_users_output_dir(tmp_path):
    """A run launched with an --output_dir of the user's writes there (in a version directory with
    --add_version): its progress, curves and model are found there (before 2026-12-07 the page
    looked in the run's directory only)."""
    from swift.app.console import check, written_to

    mine = tmp_path / "mine"
    older, version = mine / "v2-20261206-101010", mine / "v3-20261207-101010"
    for folder in (older, version):
        folder.mkdir(parents=True)
    row = {"global_step": 9, "max_steps": 9, "loss": 1.0}
    (older / "logging.jsonl").write_text(json.dumps(row) + "\n")
    run_dir = R.new_run_dir(str(tmp_path / "runs"), "sft")
    sft = launchable()["sft"]
    argv = with_outputs(sft, ["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft#8", "--output_dir",
                              str(mine)], str(run_dir))
    assert written_to(check("sft", sft, argv), run_dir) == (str(mine), True)
    (run_dir / R.RUN_FILE).write_text(json.dumps({"argv": ["sft", *argv], "pid": 1, "pid_started": 0, "started": 1,
                                                  "output_dir": str(mine), "versioned": True}))
    run = R.load_run(run_dir)
    assert run.progress() == ""  # before its log names its version directory, an older run's is not taken
    (run_dir / R.LOG_FILE).write_text(f"[INFO:swift] model builtin:tiny-chat\n[INFO:swift] this run writes to "
                                      f"{os.path.relpath(version)}\n{{'loss': 2.0}}\n")
    (version / "logging.jsonl").write_text(json.dumps({**row, "global_step": 1, "max_steps": 4}) + "\n")
    assert run.progress() == "step 1/4 (25%)"
    (version / "result.json").write_text(json.dumps({"model_dir": str(version)}))
    (version / "args.json").write_text(json.dumps({"template": "chatml"}))
    assert run.model_dir() == (str(version), None) and run.trained_with() == {"template": "chatml"}
    # --add_version false: the directory itself
    assert R.Run(run_dir, ["sft"], 1, 0.0, 1.0, None, str(older), False).progress() == "step 9/9 (100%)"
    assert written_to(check("sft", sft, argv[:-2] + ["--output_dir", str(run_dir)]), run_dir) == (None, False)


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


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """The console's page, built without serving it: (demo, its chat engines, runs_dir)."""
    from swift.app.console import build_console

    runs_dir = tmp_path_factory.mktemp("runs")
    demo, engines = build_console(str(runs_dir), lang="en")
    yield demo, engines, runs_dir
    engines.close()


def component(demo, elem_id: str):
    return next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id)


def handler(demo, elem_id: str, event: str = "click"):
    """(the function of that component's event, its inputs)."""
    target = component(demo, elem_id)._id
    fn = next(f for f in demo.fns.values() if (target, event) in f.targets)
    return fn.fn, fn.inputs


def test_the_forms_start_at_each_commands_defaults(console):
    demo, _, _ = console
    assert component(demo, "pt-tuner_type").value == "full"  # before 2026-12-07 lora: pt's form trained LoRA
    assert component(demo, "sft-tuner_type").value == "lora"
    assert component(demo, "rlhf-rlhf_type").value == "dpo"


@pytest.mark.parametrize("broken, error", [("new_run_dir", RuntimeError("no free run directory beside x")),
                                           ("launch", OSError(28, "No space left on device"))])
def test_a_launch_that_fails_is_one_line_and_leaves_no_run_directory(console, monkeypatch, broken, error):
    """Any error of a launch, not only the command's refusal, is the form's one line, and the run's
    directory made for it is removed (before 2026-12-07 gradio's generic error, the directory left)."""
    demo, _, runs_dir = console

    def fail(*_, **__):
        raise error

    monkeypatch.setattr(R, broken, fail)
    fn, inputs = handler(demo, "sft-launch")
    given = {"sft-model": "builtin:tiny-chat", "sft-dataset": "builtin:arith-sft#8"}
    before = set(runs_dir.iterdir())
    preview, message = fn(*[given.get(c.elem_id, "") for c in inputs])
    assert message == f"**Error:** {type(error).__name__}: {error}"
    assert set(runs_dir.iterdir()) == before


def finished_run(runs_dir, name: str):
    run_dir = runs_dir / name
    run_dir.mkdir()
    (run_dir / R.RUN_FILE).write_text(json.dumps({"argv": ["sft"], "pid": 1, "pid_started": 0, "started": 1}))
    (run_dir / R.EXIT_FILE).write_text(json.dumps({"returncode": 0, "stopped": False}))
    (run_dir / "result.json").write_text(json.dumps({"model_dir": "builtin:tiny-chat"}))
    return name


def test_each_browser_tab_chats_with_its_own_run(console):
    """Tab A opens run x, tab B run y: A still has x's engine, open (before 2026-12-07 one engine served
    every tab: B's choice closed A's engine, and A's chat answered with y); a tab that opens the run
    another tab has shares its engine."""
    demo, engines, runs_dir = console
    x, y = finished_run(runs_dir, "sft-x"), finished_run(runs_dir, "sft-y")
    open_chat, _ = handler(demo, "chat_run")
    *_, tab_a = open_chat(x, None)
    engine_x = engines.backend(tab_a)._engine
    *_, tab_b = open_chat(y, None)
    assert engines.backend(tab_a).name == x and engines.backend(tab_a)._engine is engine_x
    assert engines.backend(tab_b).name == y
    shown, error, _, tab_b = open_chat(x, tab_b)  # B turns to x: y's engine, held by no tab, is closed
    assert error == "" and f"`{x}`" in shown
    assert engines.backend(tab_b) is engines.backend(tab_a) and engines.runs() == [x]
    _, error, _, same = open_chat("sft-missing", tab_b)
    assert "sft-missing is not a finished run" in error and same == tab_b
    engines.release(tab_a)
    engines.release(tab_b)
    assert engines.runs() == []


class FakeEngine:
    """Answers "a", "b", "c"; records its close."""

    tokenizer = None

    def __init__(self):
        self.closed = False

    async def stream_async(self, request, config):
        import asyncio
        from types import SimpleNamespace

        for piece in "abc":
            await asyncio.sleep(0)
            yield SimpleNamespace(text=piece)

    def close(self):
        self.closed = True


def test_an_engine_is_closed_only_when_no_tab_holds_it_and_no_answer_streams():
    import asyncio

    from swift.app.chat import ChatBackend
    from swift.app.run_chat import RunEngines

    engines, built = RunEngines(), {}

    def build(run_id: str):
        def make():
            built[run_id] = FakeEngine()
            return ChatBackend(built[run_id], name=run_id)
        return make

    async def scenario():
        a = engines.hold("x", build("x"))
        b = engines.hold("x", build("x"))
        assert list(built) == ["x"] and engines.backend(a) is engines.backend(b)
        stream = engines.backend(a).stream([{"role": "user", "content": "hi"}], 0.0, 1.0, 4, None)
        assert await stream.__anext__() == "a"
        b = engines.hold("y", build("y"), previous=b)
        engines.release(a)  # tab A's session ends while its answer streams
        assert not built["x"].closed and engines.backend(a) is None
        assert [piece async for piece in stream] == ["b", "c"]
        assert built["x"].closed  # its last answer ended
        engines.release(b)
        assert built["y"].closed

    asyncio.run(scenario())


def test_the_console_without_auth_asks_for_a_password_made_at_start(tmp_path):
    """`swift web-ui` with no --auth prints a user and a password made for this start, once, and the
    page asks for them (before 2026-12-07 any local user could launch commands as its owner)."""
    import http.cookiejar
    import urllib.error
    import urllib.parse
    import urllib.request

    from tests.app.pages import start_page, stop_page

    log = tmp_path / "console.log"
    url, proc = start_page("web-ui", "--runs_dir", str(tmp_path / "runs"), log=str(log))
    try:
        lines = [line for line in log.read_text().splitlines() if "password" in line]
        assert len(lines) == 1 and lines[0].startswith("swift web-ui: log in as user swift with password "), lines
        password = lines[0].split("with password ")[1].split()[0]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url + "config", timeout=30)
        assert refused.value.code == 401
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

        def log_in(secret: str) -> int:
            form = urllib.parse.urlencode({"username": "swift", "password": secret}).encode()
            try:
                return browser.open(url + "login", form, timeout=30).status
            except urllib.error.HTTPError as e:
                return e.code

        assert log_in(password + "x") == 400
        assert log_in(password) == 200
        assert browser.open(url + "config", timeout=30).status == 200
    finally:
        stop_page(proc)


def test_export_takes_a_directory_holding_only_the_consoles_run_files(tmp_path):
    from swift.arguments.export import ExportArguments

    def export(out):
        return ExportArguments(model="builtin:tiny-chat", to_cached_dataset=True, dataset=["builtin:arith-sft#8"],
                               output_dir=str(out))

    (tmp_path / R.RUN_FILE).write_text("{}")
    (tmp_path / R.LOG_FILE).write_text("")
    export(tmp_path)  # (before 2026-12-07 refused: "already has files")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SwiftError, match="already has files; pass --exist_ok true"):
        export(tmp_path)

"""`swift web-ui`: a form per command that builds its command line, checked by the command's own
argument parser before launch; a list of runs with their log, progress and curves; stop; a chat
with a finished run's model.

Commands come from the CLI's table (`swift.cli.main.ROUTE_MAPPING`): every command but the servers
gets a form, so a command added later gets one too. The common flags are widgets (each where the
command has it, starting at the command's own default); every other flag goes through the free-text
box.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path

from swift.app import runs as R
from swift.app.chat import adapter_choices, chat_panel, error_line, require_gradio
from swift.app.i18n import label
from swift.app.run_chat import RunEngines, run_backend
from swift.utils.registry import SwiftError

SERVERS = {"deploy", "rollout", "app", "web-ui"}  # long-lived: started from a shell, not from here
# (flag, widget kind): shown on a command's form when the command has the flag
COMMON = [("model", "text"), ("adapters", "list"), ("dataset", "list"), ("val_dataset", "list"),
          ("eval_dataset", "list"), ("rlhf_type", "rlhf"), ("tuner_type", "tuner"), ("max_steps", "int"),
          ("num_train_epochs", "float"), ("learning_rate", "float"), ("per_device_train_batch_size", "int"),
          ("max_length", "int"), ("logging_steps", "int")]
LIST_FLAGS = {name for name, kind in COMMON if kind == "list"}  # space-separated values
# where a command writes, set to the run's directory unless the form says otherwise (a command's
# `outputs_read(flag values)` may name the ones a run reads: swift infer's --result_path is batch mode's)
OUTPUT_FLAGS = {"output_dir": "{dir}", "eval_output_dir": "{dir}", "result_path": "{dir}/infer_result.jsonl"}
# logged numbers that are bookkeeping, not curves
NOT_CURVES = {"global_step", "max_steps", "epoch", "elapsed_s", "total_flos", "train_runtime", "step",
              "train_loss"}  # train_loss: the whole run's mean, logged once at the end
FIRST_CURVES = ("loss", "reward", "kl", "learning_rate", "value_loss", "vf_loss", "eval_loss", "eval_acc")


def launchable() -> dict[str, type]:
    from swift.cli.main import ARGUMENT_CLASSES, ROUTE_MAPPING, _import

    return {c: _import(ARGUMENT_CLASSES[c]) for c in ROUTE_MAPPING if c not in SERVERS and c in ARGUMENT_CLASSES}


def build_argv(cls: type, widgets: dict[str, object], extra: str) -> list[str]:
    """The flags of a form: its widgets' values (empty ones left out), then the free text."""
    argv: list[str] = []
    for name, value in widgets.items():
        if value is None or not str(value).strip():
            continue
        argv.append(f"--{name}")
        argv += str(value).split() if name in LIST_FLAGS else [str(value).strip()]
    try:
        argv += shlex.split(extra or "")
    except ValueError as e:
        raise SwiftError(f"other flags: {e}") from None
    return argv


def with_outputs(cls: type, argv: list[str], run_dir: str) -> list[str]:
    """Point the command's outputs at the run's directory (flags the user gave win)."""
    from swift.arguments.parser import flag_values

    owners = cls.field_owners()
    given = {a[2:].split("=")[0] for a in argv if a.startswith("--")}
    read = set(OUTPUT_FLAGS)
    if hasattr(cls, "outputs_read"):
        try:
            read = cls.outputs_read(flag_values(cls, argv))
        except SwiftError:
            pass  # flags the check refuses, in one line
    out = list(argv)
    for flag, where in OUTPUT_FLAGS.items():
        if flag in owners and flag in read and flag not in given:
            out += [f"--{flag}", where.format(dir=run_dir)]
    # logs and model straight in the run's directory; with an --output_dir of the user's, versions as
    # on the command line (before 2026-12-07 --add_version false there too: runs overwrote each other)
    if "add_version" in owners and "add_version" not in given and "output_dir" in owners and "output_dir" not in given:
        out += ["--add_version", "false"]
    return out


def written_to(args, run_dir: Path) -> tuple[str | None, bool]:
    """(an --output_dir other than the run's directory, absolute, or None; whether the run writes to a
    version directory in it), for the Runs tab to find the run's logs and model there."""
    output_dir = getattr(args, "output_dir", None)
    if not output_dir or os.path.abspath(output_dir) == os.path.abspath(run_dir):
        return None, False
    return os.path.abspath(output_dir), bool(getattr(args, "add_version", False))


def default_of(cls: type, name: str):
    """The command's default of a flag (pt's --tuner_type is full, sft's lora)."""
    if name in cls.defaults:
        return cls.defaults[name]
    part = cls.parts[cls.field_owners()[name]]
    return next(f.default for f in dataclasses.fields(part) if f.name == name)


def check(command: str, cls: type, argv: list[str]):
    """The command's own parser and checks (one line on failure); the parsed arguments. Nothing is left
    behind in this process: some checks set environment variables that later launches would inherit,
    and --external_plugins files register names (undone by `isolated`)."""
    from swift.arguments.parser import parse_args
    from swift.plugin import isolated

    if {"-h", "--help"} & set(argv):  # argparse would print and exit the console
        raise SwiftError(f"-h/--help: run `swift {command} --help` in a shell for every flag")
    environ = dict(os.environ)
    try:
        with isolated():
            return parse_args(cls, argv, prog=f"swift {command}")
    except SystemExit as e:  # any other way a parser may try to end the process
        raise SwiftError(f"the flags were refused (exit {e.code})") from None
    finally:
        os.environ.clear()
        os.environ.update(environ)


def find_run(runs_dir: str, run_id: str | None):
    """The run of that id under `runs_dir` (None for any other name: a page sends what it likes)."""
    if not run_id or run_id in (".", "..") or "/" in run_id or "\\" in run_id:
        return None
    return R.load_run(Path(runs_dir) / run_id)


def curves_figure(rows: list[dict]):
    """One panel per logged metric (the usual ones first), against the step."""
    from matplotlib.figure import Figure

    keys: list[str] = []
    for row in rows:
        for k, v in row.items():
            if k not in keys and k not in NOT_CURVES and isinstance(v, (int, float)) and not isinstance(v, bool) \
                    and not k.endswith(("_runtime", "_per_second")):
                keys.append(k)
    order = {k: (FIRST_CURVES.index(k) if k in FIRST_CURVES else len(FIRST_CURVES), i) for i, k in enumerate(keys)}
    keys = sorted(keys, key=order.__getitem__)[:9]
    if not keys:
        return None
    cols = min(len(keys), 3)
    fig = Figure(figsize=(4 * cols, 2.6 * ((len(keys) + cols - 1) // cols)), dpi=80)
    for i, key in enumerate(keys):
        ax = fig.add_subplot((len(keys) + cols - 1) // cols, cols, i + 1)
        points = [(r.get("global_step", j), r[key]) for j, r in enumerate(rows) if isinstance(r.get(key), (int, float))]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return fig


def build_console(runs_dir: str, *, lang: str, title: str | None = None):
    """The console page and the chat engines it owns (`RunEngines`: close them when the page ends)."""
    gr = require_gradio()
    commands = launchable()
    engines = RunEngines()

    def t(key: str) -> str:
        return label(key, lang)

    with gr.Blocks(title=title or t("console_title")) as demo:
        gr.Markdown(f"## {title or t('console_title')}")
        with gr.Tabs():
            with gr.Tab(t("launch_tab"), id="launch"):
                with gr.Tabs():
                    for command, cls in commands.items():
                        with gr.Tab(f"swift {command}", id=f"form-{command}"):
                            _form(gr, t, command, cls, runs_dir)
            with gr.Tab(t("runs_tab"), id="runs"):
                chat_button = _runs(gr, t, runs_dir)
            with gr.Tab(t("chat_tab"), id="chat"):
                model_name = gr.Markdown("", elem_id="chat_model")
                # this browser tab's run: its engine is shared with the tabs chatting with the same run;
                # given up when the tab opens another run, or when gradio ends its session
                hold = gr.State(None, delete_callback=engines.release)
                adapter_box = chat_panel(engines.backend, lang, session=hold, prefix="chat_")
        run_select, chat_message, chat_click = chat_button

        def open_chat(run_id: str, held):
            run = find_run(runs_dir, run_id)
            if run is None or run.status != "finished":
                return gr.update(), f"{t('error')}: {run_id or '-'} is not a finished run", gr.update(), held
            model, adapter = run.model_dir()
            try:
                held = engines.hold(run.id, lambda: run_backend(run), held)
            except Exception as e:  # noqa: BLE001 - shown on the page
                return gr.update(), f"{t('error')}: {error_line(e)}", gr.update(), held
            choices, chosen = adapter_choices(engines.backend(held), lang)
            return (f"{t('chat_model')}: `{run.id}` ({adapter or model})", "",
                    gr.update(choices=choices, value=chosen, visible=len(choices) > 1), held)

        chat_click.click(open_chat, [run_select, hold], [model_name, chat_message, adapter_box, hold])
    return demo, engines


def _form(gr, t, command: str, cls: type, runs_dir: str) -> None:
    owners = cls.field_owners()
    widgets: dict[str, object] = {}
    for name, kind in COMMON:
        if name not in owners:
            continue
        elem = f"{command}-{name}"
        if kind == "rlhf":
            from swift.rlhf import ALGORITHMS

            widgets[name] = gr.Dropdown(choices=list(ALGORITHMS), value=default_of(cls, name), label=f"--{name}",
                                        elem_id=elem)
        elif kind == "tuner":  # the command's default (before 2026-12-07 lora, also on pt's form)
            from swift.arguments.tuner import TUNER_TYPES

            widgets[name] = gr.Dropdown(choices=list(TUNER_TYPES), value=default_of(cls, name), label=f"--{name}",
                                        elem_id=elem)
        else:  # numbers too: an empty box is a flag not given (the command's parser reads the text)
            widgets[name] = gr.Textbox(label=f"--{name}", elem_id=elem,
                                       placeholder="space-separated" if kind == "list" else "")
    extra = gr.Textbox(label=t("extra_flags"), placeholder=t("extra_placeholder"), elem_id=f"{command}-extra")
    preview = gr.Textbox(label=t("command"), interactive=False, elem_id=f"{command}-command")
    message = gr.Markdown("", elem_id=f"{command}-message")
    with gr.Row():
        check_button = gr.Button(t("preview"), elem_id=f"{command}-check")
        launch_button = gr.Button(t("launch"), variant="primary", elem_id=f"{command}-launch")
    names = list(widgets)

    def prepared(values: list, extra_text: str, run_dir: str) -> tuple[list[str], object]:
        argv = with_outputs(cls, build_argv(cls, dict(zip(names, values)), extra_text), run_dir)
        return argv, check(command, cls, argv)

    def on_check(*values):
        *values, extra_text = values
        placeholder = str(Path(runs_dir) / f"{command}-<time>")
        try:
            argv, _ = prepared(values, extra_text, placeholder)
        except Exception as e:  # noqa: BLE001 - one line on the page
            return gr.update(), f"**{t('error')}:** {error_line(e)}"
        return shlex.join(["swift", command, *argv]), ""

    def on_launch(*values):
        *values, extra_text = values
        run_dir = None
        try:
            run_dir = R.new_run_dir(runs_dir, command)
            argv, args = prepared(values, extra_text, str(run_dir))
            run = R.launch(run_dir, [command, *argv], *written_to(args, run_dir))
        except Exception as e:  # noqa: BLE001 - one line on the page (before 2026-12-07 only our own errors)
            if run_dir is not None:
                _remove_if_empty(run_dir)  # nothing was started
            return gr.update(), f"**{t('error')}:** {error_line(e)}"
        return run.command_line, f"{t('launched')}: `{run.id}`"

    inputs = [*widgets.values(), extra]
    check_button.click(on_check, inputs, [preview, message])
    launch_button.click(on_launch, inputs, [preview, message])


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:  # not empty: the keeper started, and its files say what happened
        pass


def _runs(gr, t, runs_dir: str):
    table = gr.Dataframe(headers=[t("run"), t("status"), t("progress"), t("command")], value=[[""] * 4],
                         interactive=False, elem_id="runs_table", label=t("runs_table"), wrap=True)
    run_select = gr.Dropdown(choices=[], label=t("run"), elem_id="run_select", allow_custom_value=True)
    status = gr.Markdown("", elem_id="run_status")
    with gr.Row():
        stop_button = gr.Button(t("stop_run"), variant="stop", elem_id="stop_run")
        chat_button = gr.Button(t("chat_with_run"), elem_id="chat_run")
    message = gr.Markdown("", elem_id="runs_message")
    curves = gr.Plot(label=t("curves"), elem_id="run_curves")
    log = gr.Textbox(label=t("log"), lines=12, max_lines=12, interactive=False, elem_id="run_log", autoscroll=True)
    timer = gr.Timer(1.0)
    shown = gr.State(None)  # (run, rows logged) of the curves on this page

    def refresh(selected: str | None, shown_key):
        current = selected
        R.reap()
        all_runs = R.list_runs(runs_dir)
        rows = [[r.id, r.status, r.progress(), r.command_line] for r in all_runs] or [[t("no_runs"), "", "", ""]]
        ids = [r.id for r in all_runs]
        if selected not in ids:
            selected = ids[0] if ids else None
        run = next((r for r in all_runs if r.id == selected), None)
        if run is None:
            return rows, gr.update(choices=ids, value=None), "", gr.update(), "", None
        text = f"**{run.id}** — {t('status')}: **{run.status}**" + (f" — {run.progress()}" if run.progress() else "")
        metrics = run.metrics()
        key = (run.id, len(metrics))  # redraw only when something new was logged
        plot = curves_figure(metrics) if shown_key != list(key) else gr.update()
        # the value only when it changes: setting it anew would redraw a dropdown being typed in
        choice = gr.update(choices=ids) if selected == current else gr.update(choices=ids, value=selected)
        return rows, choice, text, plot, run.log_tail(), list(key)

    outputs = [table, run_select, status, curves, log, shown]
    timer.tick(refresh, [run_select, shown], outputs, show_progress="hidden")
    run_select.input(lambda s: refresh(s, None), run_select, outputs, show_progress="hidden")  # the user's choice

    def on_stop(selected: str | None):
        run = find_run(runs_dir, selected)
        if run is None or run.status != "running":
            return f"{t('error')}: {selected or '-'} is not running"
        R.stop(run)
        return f"{t('stop_run')}: `{run.id}`"

    stop_button.click(on_stop, run_select, message)
    return run_select, message, chat_button

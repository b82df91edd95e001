import os
import subprocess
import sys


def swift(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "swift", *argv], capture_output=True, text=True, env=env)


def test_help_lists_working_commands():
    out = swift("--help")
    assert out.returncode == 0
    for cmd in ("pt", "sft", "rlhf", "infer", "deploy", "merge-lora"):
        assert f"  {cmd}" in out.stdout


def test_command_help_lists_flags_with_defaults():
    out = swift("sft", "--help")
    assert out.returncode == 0
    assert "--lora_rank LORA_RANK" in out.stdout and "LoRA rank r. (default: 8)" in " ".join(out.stdout.split())
    assert "--truncation_strategy" in out.stdout and "--learning_rate" in out.stdout


def test_command_help_is_kept_and_reprinted_without_the_imports(tmp_path):
    """`swift <command> --help` is made once per key (the package's files, the libraries' versions,
    the terminal width): a second call prints the same text without importing torch, and a
    different key makes it anew."""
    import os

    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},  # bytecode written too
           "SWIFT_CACHE_HOME": str(tmp_path), "COLUMNS": "100"}
    code = ("import sys\nfrom swift.cli.main import help_text\nprint(help_text('rlhf'), end='')\n"
            "print('torch' in sys.modules)")
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert first.returncode == second.returncode == 0, first.stderr[-2000:]
    assert first.stdout.endswith("True\n") and second.stdout.endswith("False\n")
    assert first.stdout[:-5] == second.stdout[:-6] and "--rlhf_type" in second.stdout
    assert len(os.listdir(tmp_path / "help")) == 1
    wider = subprocess.run([sys.executable, "-m", "swift", "rlhf", "--help"], capture_output=True, text=True,
                           env={**env, "COLUMNS": "160"})
    assert wider.returncode == 0 and len(os.listdir(tmp_path / "help")) == 1  # the 100-column text replaced
    assert wider.stdout != second.stdout[:-6] and "--rlhf_type" in wider.stdout  # wrapped at 160 columns


def test_unknown_command_and_flag_exit_2_with_one_line():
    out = swift("stf")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["swift: unknown command 'stf'. Did you mean 'sft'? Commands: pt, sft, rlhf, infer, eval, sample, rollout, deploy, merge-lora, export, attack, estimate, app, web-ui"]
    out = swift("sft", "--model", "builtin:tiny-chat", "--datset", "x")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["swift sft: error: unknown flag '--datset'. Did you mean '--dataset'?"]


def test_user_errors_are_one_line_and_nonzero(tmp_path):
    out = swift("sft", "--model", "builtin:tiny-chat", "--dataset", str(tmp_path / "missing.jsonl"),
                "--output_dir", str(tmp_path / "o"))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("swift sft: error: --dataset")
    assert "Traceback" not in out.stderr


def test_underscore_command_alias():
    assert swift("merge_lora", "--help").returncode == 0


def test_torchrun_command_line():
    from swift.cli.main import torchrun_command

    cmd = torchrun_command("sft", ["--model", "m"], {"NPROC_PER_NODE": "2", "MASTER_PORT": "29600"})
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert cmd[cmd.index("--nproc_per_node") + 1] == "2" and cmd[cmd.index("--master_port") + 1] == "29600"
    assert cmd[-5:] == ["-m", "swift.cli.main", "sft", "--model", "m"]


def test_ms_swift_python_entry_points(tmp_path):
    """ms-swift's documented way to run from Python: `from swift.llm import sft_main, TrainArguments`."""
    import json
    import os

    import swift.llm
    from swift.llm import (DeployArguments, InferArguments, RLHFArguments, RolloutArguments, TrainArguments,  # noqa: F401
                           deploy_main, infer_main, pt_main, rlhf_main, rollout_main, sft_main)

    args = TrainArguments(model="builtin:tiny-chat", dataset=["builtin:arith-sft#16"], max_steps=2,
                          per_device_train_batch_size=4, logging_steps=1, output_dir=str(tmp_path), report_to=["none"])
    result = sft_main(args)
    assert os.path.dirname(result["output_dir"]) == str(tmp_path)  # ms-swift's versioned run directory
    logged = [json.loads(line) for line in open(os.path.join(result["output_dir"], "logging.jsonl"))]
    assert any("loss" in row for row in logged)
    assert set(swift.llm.__all__) >= {"sft_main", "pt_main", "rlhf_main", "infer_main", "deploy_main",
                                      "TrainArguments", "RLHFArguments", "InferArguments", "DeployArguments"}


def test_every_ms_swift_flag_is_supported_or_refused_in_one_line():
    """docs/cli.md's table of ms-swift's flags matches the parser: a supported flag is a flag of
    each command named; a refused one stops `swift <command>` with the one-line reason."""
    import os
    import re

    import pytest

    from swift.arguments.ms_swift import REFUSED
    from swift.arguments.parser import parse_args
    from swift.cli.main import ARGUMENT_CLASSES, _import
    from swift.utils.registry import SwiftError

    table = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "cli.md"), encoding="utf-8").read()
    rows = re.findall(r"^\| `--(\w+)` \| [\w.]+ \| (supported|refused): (.*) \|$", table, re.M)
    assert len(rows) >= 440
    classes = {c: _import(path) for c, path in ARGUMENT_CLASSES.items()}
    for flag, status, detail in rows:
        if status == "refused":
            assert REFUSED.get(flag) == detail, flag
            with pytest.raises(SwiftError, match=f"^--{flag} is an ms-swift flag this version does not support: "):
                parse_args(classes["sft"], ["--model", "builtin:tiny-chat", f"--{flag}", "1"])
        elif flag != "config":
            for command in re.findall(r"`swift ([\w-]+)`", detail):
                assert flag in classes[command].field_owners(), (flag, command)


def test_serving_commands_start_without_the_training_stack():
    """infer/deploy/eval/sample/rollout import neither peft (with bitsandbytes, seconds of every start)
    nor transformers' TrainingArguments until an adapter or a training class is asked for."""
    code = ("import sys\nimport swift.pipelines.infer, swift.pipelines.deploy, swift.pipelines.eval, "
            "swift.pipelines.sample, swift.pipelines.rollout, swift.pipelines.merge_lora, swift.infer.factory, "
            "swift.infer.transformers_engine, swift.deploy.server, swift.rollout.server\n"
            "print(sorted(m for m in ('peft', 'bitsandbytes', 'transformers.training_args') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


# a stand-in for torchrun: takes a few tenths of a second to end its ranks after a signal, and
# writes down every signal it got, once it has ended them
FAKE_TORCHRUN = """
import os, signal, sys, time
got = []
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda sig, _: got.append(signal.Signals(sig).name))
open(sys.argv[1] + ".pid", "w").write(str(os.getpid()))
while not got:
    time.sleep(0.02)
time.sleep(0.8)  # ends its ranks
open(sys.argv[1], "w").write(",".join(got))
sys.exit(3)
"""
LAUNCHER = ("import sys\nimport swift.cli.main as M\n"
            "M.torchrun_command = lambda command, argv, env: [sys.executable, {fake!r}, {mark!r}]\n"
            "M.main(['sft', '--model', 'm'])\n")


def _launch_fake_torchrun(tmp_path):
    import os
    import time

    fake, mark = tmp_path / "torchrun.py", tmp_path / "ended"
    fake.write_text(FAKE_TORCHRUN)
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"} | {"NPROC_PER_NODE": "2"}
    import signal

    # as from a terminal: SIGINT at its default (a test runner's worker may ignore it, and an ignored
    # SIGINT stays ignored in its children, where Ctrl-C would then do nothing)
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER.format(fake=str(fake), mark=str(mark))], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pid_file = tmp_path / "ended.pid"
    deadline = time.time() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.time() < deadline and launcher.poll() is None, launcher.communicate()
        time.sleep(0.05)
    return launcher, mark, int(pid_file.read_text())


def _end(pid: int) -> None:
    import os
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_ctrl_c_reaches_torchrun_once_and_waits_for_it(tmp_path):
    """A Ctrl-C at the terminal (SIGINT to the foreground process group): torchrun gets one SIGINT,
    the launcher waits while it ends its ranks, then says so in one line and exits 130 (before
    2026-12-07 torchrun was killed 0.25 s later, its ranks orphaned, under a traceback)."""
    import os
    import signal

    launcher, mark, torchrun = _launch_fake_torchrun(tmp_path)
    try:
        os.killpg(launcher.pid, signal.SIGINT)
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 130, err
        assert err.strip().splitlines() == ["swift sft: interrupted"], err
        assert mark.read_text() == "SIGINT"  # once, and it had ended its ranks before the launcher ended
    finally:
        _end(torchrun)


def test_sigterm_to_the_launcher_is_passed_to_torchrun(tmp_path):
    """The web console's stop, or a scheduler, terminates the launcher: torchrun is terminated too and
    the launcher ends with its exit code (before 2026-12-07 the launcher died alone, torchrun ran on)."""
    import os
    import signal

    launcher, mark, torchrun = _launch_fake_torchrun(tmp_path)
    try:
        os.kill(launcher.pid, signal.SIGTERM)
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 3, err
        assert mark.read_text() == "SIGTERM" and "Traceback" not in err
    finally:
        _end(torchrun)


def test_launcher_variables_are_refused_by_commands_of_one_process():
    """NPROC_PER_NODE / NNODES above 1 start ranks for pt, sft and rlhf only; any other command says so
    in one line (before 2026-12-07 they were ignored: `NPROC_PER_NODE=8 swift infer` ran one process)."""
    import os

    from swift.cli.main import refuse_launch_env

    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NNODES")} | {"NPROC_PER_NODE": "2"}
    out = swift("infer", "--model", "builtin:tiny-chat", env=env)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["swift infer: error: NPROC_PER_NODE=2: swift infer runs as one "
                                               "process (only pt/sft/rlhf start several); unset NPROC_PER_NODE"]
    assert "NNODES=2:4" in refuse_launch_env("export", {"NNODES": "2:4"})
    for command, variables in [("sft", {"NPROC_PER_NODE": "2"}), ("infer", {"NPROC_PER_NODE": "1", "NNODES": "1"}),
                               ("infer", {"NNODES": "1:1"}), ("web-ui", {"NPROC_PER_NODE": "2"}),  # for its runs
                               ("infer", {"NPROC_PER_NODE": "2", "LOCAL_RANK": "0"})]:  # a rank's own process
        assert refuse_launch_env(command, variables) is None, (command, variables)


def test_a_second_config_file_is_refused():
    """One config file per line (before 2026-12-07 a second one was silently ignored)."""
    import pytest

    from swift.arguments.export import ExportArguments
    from swift.arguments.parser import ArgumentError, parse_args

    for argv, names in [(["a.yaml", "--config", "b.yaml"], "a.yaml, b.yaml"),
                        (["--config", "a.yaml", "--config=b.json"], "a.yaml, b.json")]:
        with pytest.raises(ArgumentError) as refused:
            parse_args(ExportArguments, [*argv, "--model", "builtin:tiny-chat"])
        assert str(refused.value) == (f"2 config files ({names}): give one (a leading file or --config); put the "
                                      "other's keys in it or as flags")


def test_every_python_api_name_in_the_command_table_imports():
    """docs/cli.md's table names each command's Python entry point: a bare name is importable from
    `swift` (before 2026-12-07 `rollout_main` was not), a dotted one from its module."""
    import importlib
    import re

    import swift

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "cli.md")) as f:
        names = re.findall(r"^\| `[a-z-]+` \|.*\| `([\w.]+)` \|$", f.read(), re.M)
    assert len(names) >= 14
    for name in names:
        module, _, attr = name.rpartition(".")
        assert callable(getattr(importlib.import_module(module) if module else swift, attr)), name

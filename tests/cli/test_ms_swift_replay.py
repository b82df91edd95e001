"""ms-swift's own example command lines (tests/data/ms_swift_commands.txt, 58 lines from its
examples/) against our parser: each line of a command this version has either parses, or stops
with one line — an ms-swift flag or value refused with its reason — never "unknown flag" and never
a traceback; and each pt/sft/rlhf/infer line, with the hub pieces swapped for local ones, runs to
completion on the built-in model or stops with one line."""
import json
import os
import re
import shlex
import signal
import subprocess

import pytest

from swift.arguments.parser import ArgumentError, parse_args
from swift.cli.main import ARGUMENT_CLASSES, _import
from swift.utils.registry import SwiftError
from tests.conftest import CORE_SHARE

CORPUS = os.path.join(os.path.dirname(__file__), "..", "data", "ms_swift_commands.txt")
CONFIGS = os.path.join(os.path.dirname(__file__), "..", "data", "ms_swift_configs")  # the YAML files lines name


def corpus() -> list[tuple[str, str, list[str]]]:
    """(source, command, argv) per line; shell values (`$nproc`, `$(expr ...)`, `<node_ip>`) become
    plain values, as a shell would expand them."""
    out, source = [], None
    for line in open(CORPUS, encoding="utf-8").read().splitlines():
        if line.startswith("# source:"):
            source = line.split(":", 1)[1].strip()
            continue
        if not line.strip() or line.startswith("#"):
            continue
        line = re.sub(r"\$\(expr [^)]*\)", "8", line)
        line = re.sub(r"\$\{?\w+\}?", "2", line)
        line = re.sub(r"<[^>]*port[^>]*>", "8000", line)
        line = re.sub(r"<[^>]+>", "127.0.0.1", line)
        tokens = shlex.split(line)
        at = tokens.index("swift")
        argv = tokens[at + 2:]
        if "--config" in argv:
            i = argv.index("--config") + 1
            argv[i] = os.path.join(CONFIGS, os.path.basename(argv[i]))
        out.append((source, tokens[at + 1], argv))
    return out


LINES = corpus()


def test_the_corpus_is_the_collected_one():
    assert len(LINES) == 58 and {c for _, c, _ in LINES} >= {"sft", "pt", "rlhf", "infer", "deploy", "rollout"}


@pytest.mark.parametrize("source,command,argv", [x for x in LINES if x[1] in ARGUMENT_CLASSES],
                         ids=lambda x: x if isinstance(x, str) and "/" in x else None)
def test_an_ms_swift_command_line_parses_or_is_refused_in_one_line(source, command, argv):
    try:
        parse_args(_import(ARGUMENT_CLASSES[command]), argv)
    except ArgumentError as e:
        message = str(e)
        assert "unknown flag" not in message and "\n" not in message, (source, message)
        assert "is an ms-swift" in message or "invalid choice" in message, (source, message)
    except SwiftError as e:
        assert "\n" not in str(e), (source, str(e))


# what a hub dataset becomes here, by --rlhf_type (sft and pt: chat data; self-cognition: its built-in copy)
RLHF_DATA = {"dpo": "arith-dpo", "orpo": "arith-dpo", "simpo": "arith-dpo", "cpo": "arith-dpo", "rm": "arith-dpo",
             "kto": "arith-kto", "prm": "arith-prm"}
# lengths capped to the built-in model's 512-token context and a quick run
CAPS = {"--max_completion_length": 16, "--max_new_tokens": 16, "--max_length": 512, "--vllm_max_model_len": 512}
MODELS = ("--model", "--teacher_model", "--ref_model", "--reward_model")


def on_this_machine(command: str, argv: list[str], out) -> list[str]:
    """The same command line with the hub pieces swapped for local ones: models for the built-in tiny
    model, `swift/self-cognition` for `builtin:self-cognition`, other datasets for the built-in data of
    the command (at most 16 rows for rlhf, 64 otherwise, 8 to infer), lengths capped, 1 step into `out`."""
    rlhf_type = argv[argv.index("--rlhf_type") + 1] if "--rlhf_type" in argv else None
    mapped, flag = [], None
    for token in argv:
        if token.startswith("--"):
            flag = token
            mapped.append(token)
        elif flag in MODELS:
            mapped.append("builtin:tiny-chat")
        elif flag in ("--dataset", "--val_dataset"):
            name, _, count = token.partition("#")
            rows = min(int(count or 64), 8 if command == "infer" else 16 if command == "rlhf" else 64)
            local = "self-cognition" if name == "swift/self-cognition" else RLHF_DATA.get(rlhf_type, "arith-sft")
            mapped.append(f"builtin:{local}#{rows}")
        elif flag in CAPS and token.isdigit():
            mapped.append(str(min(int(token), CAPS[flag])))
        else:
            mapped.append(token)
    if command == "infer":  # batch mode's file (refused in the chat since 2026-12-07)
        return [*mapped, "--result_path", str(out / "result.jsonl")] if "--val_dataset" in mapped else mapped
    return [*mapped, "--max_steps", "1", "--output_dir", str(out), "--add_version", "false", "--report_to", "none",
            "--save_strategy", "no", "--disable_tqdm", "true", "--split_dataset_ratio", "0"]


RUN = [x for x in LINES if x[1] in ("sft", "pt", "rlhf", "infer")]
COMPLETED: list[str] = []  # the sources of the lines that ran to completion in this session


def test_at_least_40_lines_are_run():
    assert len(RUN) >= 40


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """Every line of RUN, each in its own `swift` process with one thread, as many at a time as this
    worker has cores (CORE_SHARE: the lines are independent; each process mostly builds a tiny model
    and trains a step, so one per core fills them). The processes are forked from one that has imported the pipelines (`fork_runner.py`), so
    each line does not pay the imports again: {index: (its process's result, its output dir)}."""
    import sys
    from types import SimpleNamespace

    outs = [tmp_path_factory.mktemp("replay") for _ in RUN]
    logs = [tmp_path_factory.mktemp("replay-logs") for _ in RUN]
    spec = tmp_path_factory.mktemp("replay-jobs") / "jobs.json"
    spec.write_text(json.dumps({"jobs": CORE_SHARE, "dirs": [str(d) for d in logs],
                                "lines": [[command, *on_this_machine(command, argv, out)]
                                          for (_, command, argv), out in zip(RUN, outs)]}))
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC_PER_NODE", "NNODES")}
    runner = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "fork_runner.py"), str(spec)],
                              env={**env, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        assert runner.wait(timeout=1800) == 0
    finally:
        if runner.poll() is None:  # the runner and every line it forked
            os.killpg(runner.pid, signal.SIGKILL)
    results = json.loads(open(f"{spec}.out").read())
    return {i: (SimpleNamespace(**r), out) for i, (r, out) in enumerate(zip(results, outs))}


@pytest.mark.parametrize("index", range(len(RUN)), ids=[source for source, _, _ in RUN])
def test_an_ms_swift_line_runs_to_completion_here(index, replayed):
    """Each ms-swift pt/sft/rlhf/infer example runs to the end on the built-in model (training: a
    result.json; batch inference: its results; chat: ends with its input), or stops with one line
    saying why (e.g. `--attn_impl flash_attn` without CUDA, a hub adapter that cannot be fetched)."""
    source, command, argv = RUN[index]
    proc, out = replayed[index]
    if proc.returncode == 0:
        COMPLETED.append(source)
        if command == "infer":
            assert "--val_dataset" not in argv or os.path.isfile(out / "result.jsonl"), source
        else:
            assert os.path.isfile(out / "result.json"), source
    else:
        assert "Traceback" not in proc.stderr, (source, proc.stderr[-3000:])
        assert proc.stderr.strip().splitlines()[-1].startswith(f"swift {command}: error: "), (source, proc.stderr[-500:])


def test_enough_lines_run_to_completion():
    """Stopping in one line is allowed, but most of what the parser accepts must really run: of the
    17 lines whose every flag is supported here (sft, QLoRA, DPO/KTO/ORPO/SimPO/CPO/RM, GRPO, chat),
    all run but at most three (known: a GRPO batch of 2 completions for groups of 8, and a hub
    adapter that cannot be fetched)."""
    if len(COMPLETED) == 0:
        pytest.skip("the replay runs were not selected in this session")
    assert len(COMPLETED) >= 14, COMPLETED


SERVE = [x for x in LINES if x[1] in ("deploy", "rollout")]


@pytest.mark.parametrize("source,command,argv", SERVE, ids=lambda x: x if isinstance(x, str) and "/" in x else None)
def test_an_ms_swift_server_line_serves_or_stops_in_one_line(source, command, argv, tmp_path):
    """Each ms-swift deploy/rollout example, on a free loopback port with the built-in model, comes up
    and answers (deploy: a chat completion from the real `openai` client; rollout: /health), or stops
    with one line saying why."""
    import sys
    import time
    import urllib.request

    from tests.deploy.serving import free_port, stop

    port = str(free_port())
    mapped = on_this_machine("infer", argv, tmp_path)  # models and datasets swapped
    if "--result_path" in mapped:  # no result file
        del mapped[-2:]
    for flag, value in (("--port", port), ("--host", "127.0.0.1")):
        if flag in mapped:
            mapped[mapped.index(flag) + 1] = value
        else:
            mapped += [flag, value]
    proc = subprocess.Popen([sys.executable, "-m", "swift", command, *mapped], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    base, deadline = f"http://127.0.0.1:{port}", time.time() + 180
    try:
        while proc.poll() is None and time.time() < deadline:
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        if proc.poll() is not None:
            stderr = proc.stderr.read()
            assert proc.returncode != 0 and "Traceback" not in stderr, (source, stderr[-3000:])
            assert stderr.strip().splitlines()[-1].startswith(f"swift {command}: error: "), (source, stderr[-500:])
            return
        assert time.time() < deadline, f"{source}: swift {command} did not come up"
        if command == "deploy":
            import openai

            client = openai.OpenAI(base_url=base + "/v1", api_key="none")
            model = client.models.list().data[0].id
            reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "1+1="}],
                                                   max_tokens=4)
            assert reply.choices[0].message.content is not None
    finally:
        if proc.poll() is None:
            stop(proc)

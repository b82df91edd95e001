"""ms-swift's own example command lines (tests/data/ms_swift_commands.txt, 58 lines from its
examples/) against our parser: each line of a command this version has either parses, or stops
with one line — an ms-swift flag or value refused with its reason — never "unknown flag" and never
a traceback. (Running each line to completion on the built-in model is the next step of the
replay; these check the command lines as written.)"""
import os
import re
import shlex

import pytest

from swift.arguments.parser import ArgumentError, parse_args
from swift.cli.main import ARGUMENT_CLASSES, _import
from swift.utils.registry import SwiftError

CORPUS = os.path.join(os.path.dirname(__file__), "..", "data", "ms_swift_commands.txt")


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
        out.append((source, tokens[at + 1], tokens[at + 2:]))
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


def on_this_machine(argv: list[str], out) -> list[str]:
    """The same command line with the hub pieces swapped for local ones: the model for the built-in
    tiny model, `swift/self-cognition` for `builtin:self-cognition`, other datasets for the built-in
    chat data (row counts kept, capped at 64), and 2 steps into `out`."""
    mapped, flag = [], None
    for token in argv:
        if token.startswith("--"):
            flag = token
            mapped.append(token)
        elif flag == "--model":
            mapped.append("builtin:tiny-chat")
        elif flag == "--dataset":
            name, _, count = token.partition("#")
            rows = min(int(count or 64), 64)
            mapped.append(f"builtin:self-cognition#{rows}" if name == "swift/self-cognition" else f"builtin:arith-sft#{rows}")
        else:
            mapped.append(token)
    return [*mapped, "--max_steps", "2", "--output_dir", str(out), "--add_version", "false", "--report_to", "none",
            "--save_strategy", "no", "--disable_tqdm", "true"]


def parses(command: str, argv: list[str]) -> bool:
    try:
        parse_args(_import(ARGUMENT_CLASSES[command]), argv)
        return True
    except SwiftError:
        return False


RUNNABLE = [x for x in LINES if x[1] in ("sft", "pt") and parses(x[1], x[2])]


@pytest.mark.parametrize("source,command,argv", RUNNABLE, ids=lambda x: x if isinstance(x, str) and "/" in x else None)
def test_an_ms_swift_sft_line_runs_to_completion_here(source, command, argv, tmp_path):
    """Each ms-swift sft/pt example that parses here trains to the end on the built-in model, or
    stops with one line saying why (e.g. `--attn_impl flash_attn` on a machine without CUDA)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "swift", command, *on_this_machine(argv, tmp_path)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode == 0:
        assert os.path.isfile(tmp_path / "result.json")
    else:
        assert "Traceback" not in proc.stderr, (source, proc.stderr[-3000:])
        assert proc.stderr.strip().splitlines()[-1].startswith(f"swift {command}: error: "), (source, proc.stderr[-500:])

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

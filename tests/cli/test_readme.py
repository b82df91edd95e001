"""The README's table of commands: every example parses with its command's own parser, and every
page it links to exists."""
from __future__ import annotations

import os
import re
import shlex

from swift.arguments.parser import parse_args
from swift.cli.main import ARGUMENT_CLASSES, ROUTE_MAPPING, _import
from swift.utils.registry import SwiftError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def command_rows() -> list[list[str]]:
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    table = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| `swift ")]


def test_every_command_is_in_the_table_with_an_example_that_parses_and_pages_that_exist():
    rows = command_rows()
    assert sorted(r[0].strip("`").split()[1] for r in rows) == sorted(ROUTE_MAPPING)  # every command, once
    for command_cell, _, example, docs in rows:
        command = command_cell.strip("`").split()[1]
        argv = shlex.split(example.strip("`"))
        assert argv[:2] == ["swift", command], example
        argv = ["builtin:tiny-chat" if a == "M" else a for a in argv[2:]]  # M: any model
        try:
            parse_args(_import(ARGUMENT_CLASSES[command]), argv, prog=f"swift {command}")
        except SwiftError as e:  # only a placeholder path may be missing, never a flag
            assert any(p in str(e) for p in argv if "..." in p or p.endswith(".jsonl")), (example, str(e))
        for target in re.findall(r"\]\(([^)#]+)", docs):
            assert os.path.exists(os.path.join(ROOT, target)), target

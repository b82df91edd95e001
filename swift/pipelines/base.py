"""Pipeline helpers: turn `argv | Arguments | None` into arguments and run."""
from __future__ import annotations

from typing import Any

from swift.arguments.base import ComposedArguments
from swift.arguments.parser import parse_args


def resolve_args(cls: type[ComposedArguments], args: Any, prog: str) -> ComposedArguments:
    if isinstance(args, cls):
        return args
    if isinstance(args, ComposedArguments):
        raise TypeError(f"{prog} takes {cls.__name__}, got {type(args).__name__}")
    return parse_args(cls, None if args is None else list(args), prog=prog)

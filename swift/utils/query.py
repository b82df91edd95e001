"""The `?key=value&...` part of a generated dataset's spec (`reasoning_gym:`, `verifiers:`)."""
from __future__ import annotations

import yaml

from swift.utils.registry import SwiftError


def query_args(spec: str, query: str) -> dict:
    """`max_terms=2&operators=[+]` → {"max_terms": 2, "operators": ["+"]}: values read as YAML (not
    urllib's parsing: '+' is a value here, not a space)."""
    args = {}
    for pair in filter(None, query.split("&")):
        key, eq, value = pair.partition("=")
        if not eq:
            raise SwiftError(f"--dataset {spec}: '{pair}' is not key=value")
        args[key] = yaml.safe_load(value)
    return args

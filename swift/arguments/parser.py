"""argv / config file → a command's ComposedArguments.

Built on HfArgumentParser so every dataclass field becomes `--field` with its help text and
default. A leading `.yaml`/`.json` path or `--config FILE` supplies defaults; explicit flags win.
Errors are one line naming the flag (and the closest valid one) and exit with status 2.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import yaml
from transformers import HfArgumentParser

from swift.arguments.base import ComposedArguments
from swift.arguments.ms_swift import refusal
from swift.utils.registry import SwiftError, closest


class ArgumentError(SwiftError):
    """A bad command line; the CLI exits 2."""


class _Parser(HfArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ArgumentError(message)


def load_config(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ArgumentError(f"config file {path} does not exist")
    text = p.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ArgumentError(f"config file {path} is not valid {p.suffix[1:].upper()}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ArgumentError(f"config file {path} must hold a mapping of flag: value")
    return data


def split_config(argv: list[str]) -> tuple[str | None, list[str]]:
    """Find the config file: a leading .yaml/.json path, or `--config FILE` anywhere. A second one is
    refused (before 2026-12-07 it was silently ignored)."""
    argv = list(argv)
    found: list[str] = []
    rest: list[str] = []
    if argv and argv[0].endswith((".yaml", ".yml", ".json")) and not argv[0].startswith("-"):
        found.append(argv.pop(0))
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--config" and i + 1 < len(argv):
            found.append(argv[i + 1])
            i += 2
            continue
        if a.startswith("--config="):
            found.append(a.split("=", 1)[1])
        else:
            rest.append(a)
        i += 1
    if len(found) > 1:
        raise ArgumentError(f"{len(found)} config files ({', '.join(found)}): give one (a leading file or --config); "
                            "put the other's keys in it or as flags")
    return (found[0] if found else None), rest


# OpenRLHF's dotted flags (its April 2026 rename) that name one of ours
OPENRLHF_FLAGS = {
    "rollout.n_samples_per_prompt": "n_samples_per_prompt", "algo.kl.init_coef": "init_kl_coef",
    "algo.kl.target": "kl_target", "algo.kl.horizon": "kl_horizon", "algo.kl.estimator": "kl_estimator",
    "algo.advantage.estimator": "advantage_estimator", "algo.advantage.gamma": "gamma",
    "algo.advantage.lambd": "lam", "reward.remote_url": "remote_rm_url", "reward.clip_range": "reward_clip_range",
}


def _openrlhf_name(arg: str, aliases: dict[str, str]) -> str:
    """`--algo.kl.init_coef 0.01` → `--init_kl_coef 0.01` (also in the `--flag=value` form); a
    command's own `aliases` (another tool's name of one of its flags) likewise."""
    if not arg.startswith("--"):
        return arg
    name, eq, value = arg[2:].partition("=")
    ours = OPENRLHF_FLAGS.get(name) or aliases.get(name)
    return f"--{ours}{eq}{value}" if ours else arg


def build_parser(cls: type[ComposedArguments], prog: str) -> _Parser:
    # a part that lists its flag groups (swift rlhf's, by algorithm) gets one help section per group
    types = [group for part in cls.parts.values() for group in getattr(part, "flag_groups", (part,))]
    parser = _Parser(types, prog=prog, allow_abbrev=False,
                     description=(cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else None)
    parser.add_argument("--config", default=None, help="YAML or JSON file of flag: value defaults (explicit flags win).")
    defaults = {k: v for k, v in cls.defaults.items()}
    if defaults:
        parser.set_defaults(**defaults)
    return parser


def _flag_values(cls: type[ComposedArguments], argv: list[str], prog: str):
    """(the flags' values: defaults, the config file's, the command line's; the peer config of swift
    rlhf, or None; the config file's path), before the arguments' classes check them."""
    parser = build_parser(cls, prog)
    config_path, argv = split_config(argv)
    valid = cls.field_owners()
    aliases = getattr(cls, "aliases", {})
    config = load_config(config_path) if config_path else {}
    peer = None
    if "rlhf_args" in cls.parts:  # swift rlhf also reads the TRL/verl rlhf.yaml and verl's key=value overrides
        from swift.arguments.peer_configs import translate

        peer, config, argv = translate(cls, config, config_path, argv)
    if config:
        config = {aliases.get(k, k): v for k, v in config.items()}
        unknown = [k for k in config if k not in valid]
        if unknown:
            refused = refusal(unknown[0])
            if refused:
                raise ArgumentError(f"{config_path}: {refused}")
            raise ArgumentError(f"{config_path}: unknown key '{unknown[0]}'.{closest(unknown[0], valid)}")
        # a list flag given one value in a file (`modules_to_save: lm_head`) is a list of it, as on the
        # command line; a string would be read character by character
        listed = {a.dest for a in parser._actions if a.nargs in ("+", "*")} - {"debug"}  # HF splits its string
        parser.set_defaults(**{k: [v] if k in listed and isinstance(v, (str, int, float, bool)) else v
                               for k, v in config.items()})
    argv = [_openrlhf_name(arg, aliases) for arg in argv]
    namespace, rest = parser.parse_known_args(argv)
    if rest:
        flag = next((r for r in rest if r.startswith("-")), rest[0])
        name = flag.lstrip("-").split("=")[0]
        if flag.startswith("-") and refusal(name):
            raise ArgumentError(refusal(name))
        hint = closest(name, valid)
        hint = hint.replace("'", "'--", 1) if hint else ""
        what = "flag" if flag.startswith("-") else "argument"
        raise ArgumentError(f"unknown {what} '{flag}'.{hint}")
    return {k: v for k, v in vars(namespace).items() if k in valid}, peer, config_path


def flag_values(cls: type[ComposedArguments], argv: list[str]) -> dict[str, Any]:
    """What a command line sets each flag to (defaults, config file, flags), unchecked: for a caller
    that must know a value before the command's checks run (the web console)."""
    values, peer, _ = _flag_values(cls, list(argv), "swift")
    return peer.resolve(values) if peer else values


def parse_args(cls: type[ComposedArguments], argv: list[str] | None = None, prog: str = "swift") -> ComposedArguments:
    argv = sys.argv[1:] if argv is None else list(argv)
    values, peer, config_path = _flag_values(cls, argv, prog)
    args = cls(**(peer.resolve(values) if peer else values))
    object.__setattr__(args, "config_file", config_path)
    return args


def print_help(cls: type[ComposedArguments], prog: str) -> None:
    build_parser(cls, prog).print_help()



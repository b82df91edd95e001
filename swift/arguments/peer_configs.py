"""Other tools' descriptions of a `swift rlhf` run, translated into our flags: the shared parts.

Two forms, each key mapped onto one of our flags or refused in one line naming it:

- the TRL/verl `rlhf.yaml` (one file for a TRL DPO script and verl PPO/GRPO scripts): top-level
  `model_name_or_path`, `data: {train_file, ...}`, `beta`, `loss_type`, `peft`, `training_args`,
  `trace`, and a `ppo:` section. DPO reads the top-level keys, PPO and GRPO the `ppo:` section (and
  the model keys); the other part is checked key by key but not applied (`rlhf_yaml.py`).
- verl's Hydra overrides after the flags: `swift rlhf --rlhf_type grpo algorithm.adv_estimator=rloo
  actor_rollout_ref.rollout.n=8 ...` (`verl_overrides.VERL`, the table docs/ppo.md prints).

This module holds what both read with: value typing (`typed`, `parse_value`), `Translation`,
`refuse`, `closest_key`, and `translate`, the entry point `swift.arguments.parser` calls.

verl counts batches in prompts and steps in rollouts; ours count completions and optimizer steps.
Those keys are converted by `Translation.resolve` once every flag is known. Keys not given keep
swift's defaults, not verl's.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

from swift.arguments.parser import OPENRLHF_FLAGS, ArgumentError

# what a value must be: int, float, bool, str, or strs (one string or a list of them)
KINDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
         "strs": "a string or a list of strings"}


def typed(value: Any, kind: str, where: str) -> Any:
    """`value` as `kind`, or one line saying what `where` takes."""
    if kind == "float" and isinstance(value, str):  # YAML 1.1 reads 1e-6 as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if kind == "bool" and isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if kind == "strs" and isinstance(value, str):
        value = [value]
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "bool": isinstance(value, bool), "str": isinstance(value, str),
          "strs": isinstance(value, list) and all(isinstance(v, str) for v in value)}[kind]
    if not ok:
        raise ArgumentError(f"{where} takes {KINDS[kind]}, got {value!r}")
    return float(value) if kind == "float" else value


def parse_value(text: str) -> Any:
    """A Hydra override's value as verl reads it: int, float, true/false, null, [a,b], 'quoted'."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        items, depth, quote, start = [], 0, None, 1
        for i, ch in enumerate(text[1:-1], 1):
            if quote:
                quote = None if ch == quote else quote
            elif ch in "'\"":
                quote = ch
            elif ch == "[":
                depth += 1
            elif ch == "]":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(text[start:i])
                start = i + 1
        items.append(text[start:-1])
        return [parse_value(item) for item in items if item.strip()]
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text.lower() in ("null", "~"):
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if re.fullmatch(r"[+-]?\d[\d_]*", text):
        return int(text.replace("_", ""))
    try:
        return float(text)  # 1e-6, .5, 1_000.5, inf, nan
    except ValueError:
        return text


@dataclass
class Translation:
    """Flags from a peer form, with where each came from. Config keys give defaults (an explicit
    --flag wins); a verl override given with the same --flag is an error naming both."""
    rlhf_type: str
    explicit: set[str]  # flags given as --flag
    valid: set[str]  # this command's flags
    flags: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    staged: dict[str, tuple[Any, str]] = field(default_factory=dict)  # verl keys read together (`settle`)

    def set(self, flag: str, value: Any, where: str) -> None:
        """Config keys are read before overrides, so an override replaces a config key's value."""
        if flag not in self.valid:
            raise ArgumentError(f"{where}: this version has no --{flag}")
        before = self.origin.get(flag)
        if before and self.flags[flag] != value and is_override(before) == is_override(where):
            raise ArgumentError(f"{before} and {where} both set --{flag} ({self.flags[flag]!r} and {value!r}); "
                                "give one")
        if flag in self.explicit and is_override(where):
            raise ArgumentError(f"--{flag} and {where} both set --{flag}; give one")
        self.flags[flag], self.origin[flag] = value, where

    def stage(self, key: str, value: Any, where: str) -> None:
        self.staged[key] = (value, where)

    def get(self, key: str) -> tuple[Any, str | None]:
        return self.staged.get(key, (None, None))

    def resolve(self, values: dict[str, Any]) -> dict[str, Any]:
        """verl's counts → ours, once every flag is known (`values`: the parsed flags)."""
        from swift.arguments.verl_overrides import resolve_counts

        return resolve_counts(self, values)

    def derive(self, values: dict[str, Any], flag: str, value: Any, where: str) -> None:
        """A flag computed from verl's counts: an explicit --flag wins over a config key's, and is an
        error beside an override's."""
        if flag in self.explicit:
            if is_override(where):
                raise ArgumentError(f"--{flag} and {where} both set --{flag}; give one")
            return
        values[flag] = value


def is_override(where: str) -> bool:
    return where.startswith("verl override ")


def refuse(where: str, why: str) -> ArgumentError:
    return ArgumentError(f"{where}: {why}")


def closest_key(key: str, choices) -> str:
    match = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.6)
    if not match:  # the same last part under another section
        match = [c for c in choices if c.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]][:1]
    return f" Did you mean '{match[0]}'?" if match else ""


def _given(argv: list[str], aliases: dict[str, str]) -> tuple[set[str], str | None]:
    """The flags given as --flag (under our names) and the --rlhf_type given."""
    names, rlhf_type = set(), None
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        name, eq, value = arg[2:].partition("=")
        name = OPENRLHF_FLAGS.get(name) or aliases.get(name) or name
        names.add(name)
        if name == "rlhf_type":
            rlhf_type = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return names, rlhf_type


def translate(cls, config: dict[str, Any], path: str | None,
              argv: list[str]) -> tuple[Translation | None, dict[str, Any], list[str]]:
    """(the translation, the config as our flags, argv without overrides); None and both unchanged
    when neither form is there."""
    from swift.arguments.rlhf_yaml import is_rlhf_yaml, read_rlhf_yaml
    from swift.arguments.verl_overrides import apply_override, settle, split_overrides

    overrides, argv = split_overrides(argv)
    seed = is_rlhf_yaml(config)
    if not overrides and not seed:
        return None, config, argv
    explicit, rlhf_type = _given(argv, getattr(cls, "aliases", {}))
    t = Translation(rlhf_type or config.get("rlhf_type") or "dpo", explicit, set(cls.field_owners()))
    flat = {} if seed else dict(config)
    if seed:
        read_rlhf_yaml(t, config, path, cls)
    for key, text in overrides:
        apply_override(t, key, text)
    settle(t)
    return t, {**flat, **t.flags}, argv


if __name__ == "__main__":  # the verl override table of docs/ppo.md
    from swift.arguments.verl_overrides import VERL

    print("| verl override | swift | notes |\n|---|---|---|")
    for key, rule in VERL.items():
        print(f"| `{key}` | {rule.ours} | {rule.note} |")

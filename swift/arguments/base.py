"""Composed arguments: a command's arguments are several small dataclasses behind one flat namespace.

`SftArguments(model=..., dataset=[...], learning_rate=...)` routes each keyword to the part that
owns it, and `args.model` / `args.learning_rate` read through to that part. The CLI flag of a
field is its name; the part's `__post_init__` validates it.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar

from swift.utils.registry import SwiftError, closest


def part_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]


class ComposedArguments:
    """Base for a command's arguments. Subclasses set `parts` and may override `defaults`."""

    parts: ClassVar[dict[str, type]] = {}
    # Flag defaults that differ from the part's own default for this command (e.g. pt's loss_scale).
    defaults: ClassVar[dict[str, Any]] = {}
    # Another tool's name of a flag -> ours (the command line accepts both; `--help` lists ours).
    aliases: ClassVar[dict[str, str]] = {}

    def __init__(self, **kwargs: Any):
        owners = self.field_owners()
        unknown = [k for k in kwargs if k not in owners]
        if unknown:
            raise SwiftError(f"unknown argument '{unknown[0]}'.{closest(unknown[0], owners)}")
        values = {**self.defaults, **kwargs}
        for part_name, cls in self.parts.items():
            sub = {f.name: values[f.name] for f in part_fields(cls) if f.name in values}
            try:
                obj = cls(**sub)
            except SwiftError:
                raise
            except (ValueError, TypeError) as e:
                raise SwiftError(f"invalid {cls.__name__}: {e}") from None
            object.__setattr__(self, part_name, obj)
        self.__post_init__()

    def __post_init__(self) -> None:
        """Checks that span several parts."""

    def refuse_unread(self, parts: tuple[str, ...], read: set[str], why: str) -> None:
        """Stop on the first flag of `parts` (other than `read`) set away from its default: in this
        mode nothing reads it. `why` ends the line (e.g. "does nothing with --eval_url: ...")."""
        for part in parts:
            obj = getattr(self, part)
            for f in dataclasses.fields(self.parts[part]):
                if f.name in read or f.name.startswith("_"):
                    continue
                default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
                if getattr(obj, f.name) != default:
                    raise SwiftError(f"--{f.name} {why}")

    @classmethod
    def field_owners(cls) -> dict[str, str]:
        owners: dict[str, str] = {}
        for part_name, part_cls in cls.parts.items():
            for f in part_fields(part_cls):
                if f.name in owners:
                    raise TypeError(f"field '{f.name}' is defined by two parts: {owners[f.name]}, {part_name}")
                owners[f.name] = part_name
        return owners

    def __getattr__(self, name: str) -> Any:
        owner = type(self).field_owners().get(name)
        if owner is None:
            raise AttributeError(f"{type(self).__name__} has no argument '{name}'")
        return getattr(object.__getattribute__(self, owner), name)

    def __setattr__(self, name: str, value: Any) -> None:
        owner = type(self).field_owners().get(name)
        if owner is None:
            raise AttributeError(f"{type(self).__name__} has no argument '{name}'")
        setattr(getattr(self, owner), name, value)

    def to_dict(self) -> dict[str, Any]:
        """Every resolved flag and its value, JSON-ready (reloadable with `--config args.json`)."""
        out: dict[str, Any] = {}
        for part_name, cls in self.parts.items():
            part = getattr(self, part_name)
            for f in part_fields(cls):
                if f.name in _NOT_SAVED or f.name.endswith(("_token", "api_key")):
                    continue
                saved = getattr(part, "saved_values", {})  # a flag as given where checks rewrote it
                out[f.name] = to_jsonable(saved[f.name] if f.name in saved else getattr(part, f.name))
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"


# Values that depend on the launch (torchrun sets them) rather than on the run's recipe.
_NOT_SAVED = {"local_rank", "resume_from_checkpoint"}  # a run from args.json starts anew


def to_jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value):
        return to_jsonable(dataclasses.asdict(value))
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)

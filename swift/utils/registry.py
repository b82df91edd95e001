"""A tiny named registry: register by decorator, look up by name or `module:attr` path."""
from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class SwiftError(Exception):
    """An error the user can fix; the CLI prints it as one line and exits non-zero."""


def closest(name: str, choices) -> str:
    match = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" Did you mean '{match[0]}'?" if match else ""


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        def add(item: T) -> T:
            self._items[name] = item
            return item

        return add(obj) if obj is not None else add

    def __setitem__(self, name: str, obj: T) -> None:
        self._items[name] = obj

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def keys(self):
        return self._items.keys()

    def items(self):
        return self._items.items()

    def get(self, name: str) -> T:
        if name in self._items:
            return self._items[name]
        if ":" in name:
            module, _, attr = name.partition(":")
            try:
                return getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as e:
                raise SwiftError(f"cannot import {self.kind} '{name}': {e}") from None
        raise SwiftError(
            f"unknown {self.kind} '{name}'.{closest(name, self._items)} Valid: {', '.join(sorted(self._items))}"
        )

    __getitem__ = get

    def __repr__(self) -> str:  # pragma: no cover
        return f"Registry({self.kind}: {sorted(self._items)})"


"""The reward-function interface and its registry."""
from __future__ import annotations

from swift.utils.registry import Registry


class ORM:
    """An outcome reward: `__call__(completions, **columns) -> list[float | None]`."""

    def __init__(self, args=None, **kwargs):
        self.args = args

    def __call__(self, completions: list[str], **kwargs) -> list[float | None]:
        raise NotImplementedError(f"{type(self).__name__} must define __call__")


class AsyncORM(ORM):
    """An ORM whose `__call__` is `async`; the trainer awaits all async rewards concurrently."""

    async def __call__(self, completions: list[str], **kwargs) -> list[float | None]:
        raise NotImplementedError(f"{type(self).__name__} must define async __call__")


orms: Registry[type] = Registry("reward function")

"""Reward functions for online RL. ms-swift plugin files work unchanged:

    from swift.rewards import ORM, orms

    class MyReward(ORM):
        def __call__(self, completions, solution, **kwargs) -> list[float]: ...

    orms['my_reward'] = MyReward

An ORM class is instantiated once (with the run's arguments) and called with the completions and
every dataset column by name; `None` in the returned list means "not applicable" for that row."""
from swift.rewards.base import ORM, AsyncORM, orms
from swift.rewards import builtin, safety  # noqa: F401  (registers the built-ins)
from swift.dataset import reasoning_gym  # noqa: F401,E402  (its scorer: --reward_funcs reasoning_gym)
from swift.rollout import verifiers_env  # noqa: F401,E402  (a rubric's total: --reward_funcs verifiers)

__all__ = ["ORM", "AsyncORM", "orms"]

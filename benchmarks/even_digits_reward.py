"""The outcome reward of `process_rewards_sparse.py` (loaded with --external_plugins): 1 when the
answer is exactly six lines, each one even digit, else 0."""
from swift.rewards import ORM, orms

STEPS = 6
EVEN = ("0", "2", "4", "6", "8")


def even_steps(steps: list[str]) -> list[bool]:
    """Each step is right when it is one even digit."""
    return [step in EVEN for step in steps]


class EvenDigits(ORM):
    def __call__(self, completions, **kwargs):
        return [float(len(steps) == STEPS and all(even_steps(steps)))
                for steps in (c.strip().split("\n") for c in completions)]


orms["even_digits"] = EvenDigits

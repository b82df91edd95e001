"""A reward function: 1 when the completion's last number equals the row's `solution`, else 0.

    swift rlhf --rlhf_type grpo --external_plugins examples/plugins/reward.py --reward_funcs last_number ...
"""
import re

from swift.plugin import register
from swift.rewards import ORM


@register("reward", "last_number")
class LastNumber(ORM):
    def __call__(self, completions, solution, **kwargs):
        out = []
        for completion, answer in zip(completions, solution):
            numbers = re.findall(r"-?\d+", completion)
            out.append(float(bool(numbers) and numbers[-1] == str(answer).strip()))
        return out

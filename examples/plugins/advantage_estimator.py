"""An advantage estimator: reward minus the median of its group (robust to one outlier).

    swift rlhf --rlhf_type grpo --external_plugins examples/plugins/advantage_estimator.py \
        --advantage_estimator median_baseline ...

It receives the rewards as [prompts, group] with NaN for completions no reward function scored, and
returns advantages of the same shape (NaN rows carry no loss). --scale_rewards applies after it
(default none for a plugin estimator; group or batch divide by the std of the rewards).
"""
import torch

from swift.plugin import register


@register("advantage_estimator", "median_baseline")
def median_baseline(rewards: torch.Tensor) -> torch.Tensor:
    return rewards - rewards.nanmedian(dim=1, keepdim=True).values

"""A GRPO/PPO loss type: the unclipped policy gradient, −ratio·A per token, averaged over the
optimizer step's tokens.

    swift rlhf --rlhf_type grpo --external_plugins examples/plugins/loss_type.py --loss_type vanilla_pg ...

A loss type is a surrogate (per-token loss from the ratio π/π_old, the log-probs and the advantage)
and an aggregate from swift.rlhf.grpo (per_sequence_mean, token_mean, constant_normalizer,
global_token_mean): the aggregate returns the loss as terms whose normalisers are summed over the
whole step, so the loss does not depend on gradient accumulation or the number of ranks.
"""
import torch

from swift.plugin import register
from swift.rlhf.grpo import LossType, global_token_mean


def unclipped(ratio, logps, adv, **_):
    no_clip = torch.zeros_like(ratio, dtype=torch.bool)
    return -ratio * adv, no_clip, no_clip  # per-token loss, low-clipped and high-clipped flags


register("loss_type", "vanilla_pg", LossType(unclipped, global_token_mean))

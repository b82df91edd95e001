"""A DPO loss type: the sigmoid loss with a target margin γ (as SimPO's), −log σ(β·Δ − γ) with
Δ the difference of the chosen and rejected log-ratios to the reference.

    swift rlhf --rlhf_type dpo --external_plugins examples/plugins/dpo_loss.py --loss_type sigmoid_margin ...

`c` and `r` are the chosen and rejected log-ratios log π/π_ref of each pair; the returned per-pair
losses are averaged over the step's pairs by the trainer.
"""
import torch.nn.functional as F

from swift.plugin import register

MARGIN = 0.5


@register("dpo_loss", "sigmoid_margin")
def sigmoid_margin(c, r, *, beta, **_):
    return -F.logsigmoid(beta * (c - r) - MARGIN)

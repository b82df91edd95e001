"""DPO and its pairwise loss variants.

With log-ratios  c = log π(y_w|x) − log π_ref(y_w|x)  and  r = log π(y_l|x) − log π_ref(y_l|x),
Δ = c − r, each loss below is per pair; several `--loss_type`s are summed with `--loss_weights`, and
the step's loss is the mean over its pairs (`swift.rlhf.reduce`).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from swift.rlhf.base import ALGORITHMS, COMMON_FLAGS, REFERENCE_FLAGS, Algorithm
from swift.rlhf.logps import SequenceLogps, pair_metrics
from swift.rlhf.reduce import Terms
from swift.utils.registry import Registry
from swift.plugin import register

DPO_LOSSES: Registry[Callable[..., torch.Tensor]] = Registry("DPO loss type")


@register("dpo_loss", "sigmoid")
def sigmoid(c, r, *, beta, label_smoothing=0.0, **_):
    """DPO (arXiv 2305.18290): −log σ(βΔ); with ε = label_smoothing, cDPO: −(1−ε)log σ(βΔ) − ε log σ(−βΔ)."""
    delta = beta * (c - r)
    return -(1 - label_smoothing) * F.logsigmoid(delta) - label_smoothing * F.logsigmoid(-delta)


@register("dpo_loss", "hinge")
def hinge(c, r, *, beta, **_):
    """SLiC (arXiv 2305.10425): max(0, 1 − βΔ)."""
    return torch.relu(1 - beta * (c - r))


@register("dpo_loss", "ipo")
def ipo(c, r, *, beta, chosen_len, rejected_len, **_):
    """IPO (arXiv 2310.12036, eq. 17): (c/|y_w| − r/|y_l| − 1/(2β))², log-ratios averaged per token."""
    delta = c / chosen_len.clamp(min=1) - r / rejected_len.clamp(min=1)
    return (delta - 1 / (2 * beta)) ** 2


@register("dpo_loss", "robust")
def robust(c, r, *, beta, label_smoothing=0.0, **_):
    """Robust DPO (arXiv 2403.00409): unbiased under label-flip rate ε:
    (−(1−ε)log σ(βΔ) + ε log σ(−βΔ)) / (1 − 2ε)."""
    delta = beta * (c - r)
    return (-(1 - label_smoothing) * F.logsigmoid(delta) + label_smoothing * F.logsigmoid(-delta)) / (
        1 - 2 * label_smoothing)


@register("dpo_loss", "bco_pair")
def bco_pair(c, r, *, beta, **_):
    """BCO on pairs (arXiv 2404.04656), without the running reward shift: −log σ(βc) − log σ(−βr)."""
    return -F.logsigmoid(beta * c) - F.logsigmoid(-beta * r)


@register("dpo_loss", "sppo_hard")
def sppo_hard(c, r, *, beta, **_):
    """SPPO with hard win probabilities (arXiv 2405.00675): (c − 1/(2β))² + (r + 1/(2β))²."""
    return (c - 0.5 / beta) ** 2 + (r + 0.5 / beta) ** 2


@register("dpo_loss", "nca_pair")
def nca_pair(c, r, *, beta, **_):
    """NCA (arXiv 2402.05369): −log σ(βc) − ½ log σ(−βc) − ½ log σ(−βr)."""
    return -F.logsigmoid(beta * c) - 0.5 * F.logsigmoid(-beta * c) - 0.5 * F.logsigmoid(-beta * r)


@register("dpo_loss", "apo_zero")
def apo_zero(c, r, *, beta, **_):
    """APO-zero (arXiv 2408.06266, eq. 7): (1 − σ(βc)) + σ(βr)."""
    return 1 - torch.sigmoid(beta * c) + torch.sigmoid(beta * r)


@register("dpo_loss", "apo_down")
def apo_down(c, r, *, beta, **_):
    """APO-down (arXiv 2408.06266, eq. 8): σ(βc) + (1 − σ(βΔ))."""
    return torch.sigmoid(beta * c) + 1 - torch.sigmoid(beta * (c - r))


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, *, loss_types: list[str],
             loss_weights: list[float] | None, beta: float, label_smoothing: float = 0.0,
             chosen_len: torch.Tensor | None = None, rejected_len: torch.Tensor | None = None) -> torch.Tensor:
    """Each pair's weighted sum over `loss_types` of its losses (sequence log-probs in, [pairs] out)."""
    c, r = policy_chosen - ref_chosen, policy_rejected - ref_rejected
    weights = loss_weights or [1.0] * len(loss_types)
    total = 0.0
    for name, weight in zip(loss_types, weights, strict=True):
        per_pair = DPO_LOSSES.get(name)(c, r, beta=beta, label_smoothing=label_smoothing, chosen_len=chosen_len,
                                        rejected_len=rejected_len)
        total = total + weight * per_pair
    return total


def batch_loss(policy: SequenceLogps, ref: SequenceLogps, batch: dict, a) -> tuple[Terms, dict]:
    """Rows are [chosen..., rejected...]; `--rpo_alpha` adds the chosen answers' token-mean NLL (RPO,
    arXiv 2404.19733)."""
    n = policy.sums.size(0) // 2
    c, r, rc, rr = policy.sums[:n], policy.sums[n:], ref.sums[:n], ref.sums[n:]
    per_pair = dpo_loss(c, r, rc, rr, loss_types=a.loss_type, loss_weights=a.loss_weights or None, beta=a.beta,
                        label_smoothing=a.label_smoothing, chosen_len=policy.lengths[:n],
                        rejected_len=policy.lengths[n:])
    terms = {"pairs": per_pair.sum()}
    if a.rpo_alpha:
        terms["chosen_tokens"] = a.rpo_alpha * policy.nll_sum(slice(0, n))
    return terms, pair_metrics(a.beta * (c - rc), a.beta * (r - rr), c, r)


# ε enters only sigmoid (cDPO) and robust; TRL 1.16 ignores it for the others as well
NO_LABEL_SMOOTHING = frozenset({"ipo", "hinge", "bco_pair", "sppo_hard", "nca_pair", "apo_zero", "apo_down"})

ALGORITHMS.register("dpo", Algorithm(trainer="preference", data="pair", loss=batch_loss, reference=True,
                                     defaults={"beta": 0.1, "loss_type": ["sigmoid"]}, loss_types=DPO_LOSSES,
                                     flags=COMMON_FLAGS | REFERENCE_FLAGS | {
                                         "precompute_ref_log_probs", "beta", "loss_type", "loss_weights",
                                         "label_smoothing", "rpo_alpha"},
                                     unread_by_loss_types={"label_smoothing": NO_LABEL_SMOOTHING}))

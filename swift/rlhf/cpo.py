"""CPO (arXiv 2401.08417): DPO without a reference model plus NLL on the chosen answer.

With sequence log-probs c, r:  loss = −(1−ε) log σ(β(c − r)) − ε log σ(−β(c − r)) + α · NLL(chosen),
α = `--cpo_alpha`, ε = `--label_smoothing`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from swift.rlhf.base import ALGORITHMS, COMMON_FLAGS, Algorithm
from swift.rlhf.logps import SequenceLogps, pair_metrics
from swift.rlhf.reduce import Terms


def smoothed_sigmoid_loss(logits: torch.Tensor, *, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """Per pair: −(1−ε) log σ(β·logits) − ε log σ(−β·logits)."""
    return -(1 - label_smoothing) * F.logsigmoid(beta * logits) - label_smoothing * F.logsigmoid(-beta * logits)


def batch_loss(policy: SequenceLogps, ref, batch: dict, a) -> tuple[Terms, dict]:
    n = policy.sums.size(0) // 2
    c, r = policy.sums[:n], policy.sums[n:]
    nll = policy.nll_sum(slice(0, n))
    terms = {"pairs": smoothed_sigmoid_loss(c - r, beta=a.beta, label_smoothing=a.label_smoothing).sum(),
             "chosen_tokens": a.cpo_alpha * nll}
    return terms, {**pair_metrics(a.beta * c, a.beta * r, c, r),
                   "nll_loss": (nll / policy.lengths[:n].sum().clamp(min=1)).item()}


ALGORITHMS.register("cpo", Algorithm(trainer="preference", data="pair", loss=batch_loss,
                                     defaults={"beta": 0.1, "cpo_alpha": 1.0},
                                     flags=COMMON_FLAGS | {"beta", "label_smoothing", "cpo_alpha"}))

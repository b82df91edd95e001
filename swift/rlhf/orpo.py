"""ORPO (arXiv 2403.07691): SFT plus an odds-ratio penalty, no reference model.

With per-token mean log-probs c̄, r̄ of the chosen and rejected answers and odds(p) = p / (1 − p),
log OR = (c̄ − r̄) − (log(1 − e^c̄) − log(1 − e^r̄)),  loss = NLL(chosen) − β · mean log σ(log OR).
As in TRL (and ms-swift, which uses it), the NLL term covers the whole chosen sequence, prompt included.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from swift.rlhf.base import ALGORITHMS, COMMON_FLAGS, Algorithm
from swift.rlhf.logps import SequenceLogps, pair_metrics
from swift.rlhf.reduce import Terms


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − e^x) for x < 0, accurate at both ends (Mächler 2012)."""
    return torch.where(x > -math.log(2), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def log_odds_ratio(chosen_mean: torch.Tensor, rejected_mean: torch.Tensor) -> torch.Tensor:
    c, r = chosen_mean.float(), rejected_mean.float()
    return (c - r) - (log1mexp(c) - log1mexp(r))


def batch_loss(policy: SequenceLogps, ref, batch: dict, a) -> tuple[Terms, dict]:
    n = policy.sums.size(0) // 2
    means = policy.means
    nll = policy.whole_sequence_nll_sum(slice(0, n))
    log_or = log_odds_ratio(means[:n], means[n:])
    terms = {"chosen_all": nll, "pairs": -a.beta * F.logsigmoid(log_or).sum()}
    metrics = pair_metrics(a.beta * means[:n], a.beta * means[n:], means[:n], means[n:])
    metrics.update({"nll_loss": (nll / policy.all_lengths[:n].sum().clamp(min=1)).item(),
                    "log_odds_ratio": log_or.mean().item(),
                    "log_odds_chosen": F.logsigmoid(log_or).mean().item()})
    return terms, metrics


ALGORITHMS.register("orpo", Algorithm(trainer="preference", data="pair", loss=batch_loss, defaults={"beta": 0.1},
                                      whole_sequence_nll=True, flags=COMMON_FLAGS | {"beta"}))

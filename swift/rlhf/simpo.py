"""SimPO (arXiv 2405.14734): length-normalised log-probs as the implicit reward, a target margin γ,
no reference model.

With per-token mean log-probs c̄, r̄:  loss = −log σ(β(c̄ − r̄) − γ)  (with cDPO smoothing ε),
plus `--cpo_alpha` × NLL(chosen) as in ms-swift (CPO-SimPO; `--cpo_alpha 0` is the paper's SimPO).
"""
from __future__ import annotations

import torch

from swift.rlhf.base import ALGORITHMS, COMMON_FLAGS, Algorithm
from swift.rlhf.cpo import smoothed_sigmoid_loss
from swift.rlhf.logps import SequenceLogps, pair_metrics
from swift.rlhf.reduce import Terms


def simpo_loss(chosen_mean: torch.Tensor, rejected_mean: torch.Tensor, *, beta: float, gamma: float,
               label_smoothing: float = 0.0) -> torch.Tensor:
    return smoothed_sigmoid_loss(chosen_mean - rejected_mean - gamma / beta, beta=beta,
                                 label_smoothing=label_smoothing)


def batch_loss(policy: SequenceLogps, ref, batch: dict, a) -> tuple[Terms, dict]:
    n = policy.sums.size(0) // 2
    means = policy.means
    nll = policy.nll_sum(slice(0, n))
    terms = {"pairs": simpo_loss(means[:n], means[n:], beta=a.beta, gamma=a.simpo_gamma,
                                 label_smoothing=a.label_smoothing).sum(),
             "chosen_tokens": a.cpo_alpha * nll}
    return terms, {**pair_metrics(a.beta * means[:n], a.beta * means[n:], means[:n], means[n:]),
                   "nll_loss": (nll / policy.lengths[:n].sum().clamp(min=1)).item()}


ALGORITHMS.register("simpo", Algorithm(trainer="preference", data="pair", loss=batch_loss,
                                       defaults={"beta": 2.0, "cpo_alpha": 1.0},
                                       flags=COMMON_FLAGS | {"beta", "label_smoothing", "cpo_alpha", "simpo_gamma"}))

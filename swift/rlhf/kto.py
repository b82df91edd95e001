"""KTO (arXiv 2402.01306): unpaired desirable / undesirable answers.

With the log-ratio ρ = log π(y|x) − log π_ref(y|x) and the KL baseline z = max(0, mean ρ'), where
ρ' are log-ratios of mismatched pairs (x_i, y_j) from the same batch (eq. 8, detached):
  desirable:   λ_D (1 − σ(β(ρ − z)))       undesirable:   λ_U (1 − σ(β(z − ρ)))
with λ_D = `--desirable_weight`, λ_U = `--undesirable_weight`; the loss is the mean over the step's
completions (`pairs`: each row has a mismatched one).
"""
from __future__ import annotations

import torch

from swift.rlhf.base import ALGORITHMS, COMMON_FLAGS, REFERENCE_FLAGS, Algorithm
from swift.rlhf.logps import SequenceLogps
from swift.rlhf.reduce import Terms
from swift.utils.dist import global_mean


def kl_baseline(mismatched_logratios: torch.Tensor) -> torch.Tensor:
    """z over the global batch: every rank's mismatched pairs (as TRL gathers them)."""
    return global_mean(mismatched_logratios.detach()).clamp(min=0)


def kto_losses(logratios: torch.Tensor, desirable: torch.Tensor, kl: torch.Tensor, *, beta: float,
               desirable_weight: float = 1.0, undesirable_weight: float = 1.0) -> torch.Tensor:
    """Per-row losses; `desirable` is a bool tensor."""
    good = desirable_weight * (1 - torch.sigmoid(beta * (logratios - kl)))
    bad = undesirable_weight * (1 - torch.sigmoid(beta * (kl - logratios)))
    return torch.where(desirable, good, bad)


def batch_loss(policy: SequenceLogps, ref: SequenceLogps, batch: dict, a) -> tuple[Terms, dict]:
    """Rows are [completions..., mismatched completions...]; `batch["label"]` marks the desirable ones."""
    n = policy.sums.size(0) // 2
    logratios = policy.sums[:n] - ref.sums[:n]
    kl = kl_baseline(policy.sums[n:] - ref.sums[n:])
    desirable = batch["label"].bool()
    terms = {"pairs": kto_losses(logratios, desirable, kl, beta=a.beta, desirable_weight=a.desirable_weight,
                                 undesirable_weight=a.undesirable_weight).sum()}
    rewards = (a.beta * logratios).detach()
    metrics = {"kl": kl.item()}
    for name, rows in (("chosen", desirable), ("rejected", ~desirable)):
        if rows.any():
            metrics[f"rewards/{name}"] = rewards[rows].mean().item()
            metrics[f"logps/{name}"] = policy.sums[:n][rows].detach().mean().item()
    if desirable.any() and (~desirable).any():
        metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
    return terms, metrics


ALGORITHMS.register("kto", Algorithm(trainer="preference", data="unpaired", loss=batch_loss, reference=True,
                                     defaults={"beta": 0.1},
                                     flags=COMMON_FLAGS | REFERENCE_FLAGS | {
                                         "precompute_ref_log_probs", "beta", "desirable_weight",
                                         "undesirable_weight"}))

"""GKD: on-policy knowledge distillation with the generalized Jensen–Shannon divergence (arXiv 2306.13649).

With student p_S, teacher p_T and β ∈ [0, 1], per token, over the vocabulary:
  M = β p_T + (1 − β) p_S,   JSD_β = β KL(p_T ‖ M) + (1 − β) KL(p_S ‖ M)
β = 0 is the forward KL(p_T ‖ p_S), β = 1 the reverse KL(p_S ‖ p_T). The loss is the mean over
labelled tokens. With probability `--lmbda` a step trains on the student's own samples (on-policy);
otherwise on the dataset's answers, where `--sft_alpha` adds the student's NLL.
"""
from __future__ import annotations

import math

import torch

from swift.rlhf.base import ALGORITHMS, Algorithm


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) per position, from log-probabilities."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float,
                    temperature: float = 1.0) -> torch.Tensor:
    """Per-position JSD_β ([..., vocab] logits in, [...] out)."""
    s = torch.log_softmax(student_logits.float() / temperature, dim=-1)
    t = torch.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if beta == 0:
        return _kl(t, s)
    if beta == 1:
        return _kl(s, t)
    mixture = torch.logsumexp(torch.stack([s + math.log1p(-beta), t + math.log(beta)]), dim=0)
    return beta * _kl(t, mixture) + (1 - beta) * _kl(s, mixture)


def batch_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, a) -> tuple[torch.Tensor, dict]:
    """Logits of the labelled positions only ([tokens, vocab])."""
    loss = generalized_jsd(student_logits, teacher_logits, a.beta).mean()
    return loss, {"jsd": loss.item()}


ALGORITHMS.register("gkd", Algorithm(trainer="distill", data="conversation", loss=batch_loss,
                                     defaults={"beta": 0.5}))

"""GKD: on-policy knowledge distillation with the generalized Jensen–Shannon divergence (arXiv 2306.13649).

With student p_S, teacher p_T and β ∈ [0, 1], per token, over the vocabulary:
  M = β p_T + (1 − β) p_S,   JSD_β = β KL(p_T ‖ M) + (1 − β) KL(p_S ‖ M)
β = 0 is the forward KL(p_T ‖ p_S), β = 1 the reverse KL(p_S ‖ p_T). The loss is the mean over
labelled tokens of the optimizer step. With probability `--lmbda` a step trains on the student's own samples (on-policy);
otherwise on the dataset's answers, where `--sft_alpha` adds the student's NLL.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from swift.rlhf import logps
from swift.rlhf.base import ALGORITHMS, COMMON_FLAGS, SAMPLING_FLAGS, Algorithm
from swift.rlhf.reduce import Terms


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


def _chunk_losses(student_hidden, teacher_hidden, targets, student_weight, student_bias, teacher_weight, teacher_bias,
                  beta: float, with_nll: bool):
    student = F.linear(student_hidden.to(student_weight.dtype), student_weight, student_bias)  # as logps._project
    teacher = F.linear(teacher_hidden.to(teacher_weight.dtype), teacher_weight, teacher_bias)
    jsd = generalized_jsd(student, teacher, beta)
    nll = F.cross_entropy(student.float(), targets, reduction="none") if with_nll else torch.zeros_like(jsd)
    return jsd, nll


def head_losses(student_hidden: torch.Tensor, student_head: torch.nn.Linear, teacher_hidden: torch.Tensor,
                teacher_head: torch.nn.Linear, targets: torch.Tensor, beta: float,
                with_nll: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token JSD_β (and the student's NLL of `targets`) from hidden states ([tokens, H]) and the
    two output layers, over chunks of tokens of at most `logps.CHUNK_ELEMENTS` logits each, every
    chunk recomputed in the backward pass: the student's and teacher's full distributions exist one
    chunk at a time. Equal to `generalized_jsd` on the whole logits (tests/rlhf/test_chunked_logps.py)."""
    rows = max(1, logps.CHUNK_ELEMENTS // max(student_head.out_features, teacher_head.out_features))
    parts = []
    for start in range(0, targets.numel(), rows):
        args = (student_hidden[start:start + rows], teacher_hidden[start:start + rows], targets[start:start + rows],
                student_head.weight, student_head.bias, teacher_head.weight, teacher_head.bias, beta, with_nll)
        parts.append(checkpoint(_chunk_losses, *args, use_reentrant=False) if torch.is_grad_enabled()
                     else _chunk_losses(*args))
    if not parts:
        empty = student_hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty if with_nll else None
    jsd = torch.cat([j for j, _ in parts])
    return jsd, torch.cat([n for _, n in parts]) if with_nll else None


def batch_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, a) -> tuple[Terms, dict]:
    """Logits of the labelled positions only ([tokens, vocab]): the JSD summed over them (a `tokens` term)."""
    jsd = generalized_jsd(student_logits, teacher_logits, a.beta)
    return {"tokens": jsd.sum()}, {"jsd": jsd.mean().item() if jsd.numel() else 0.0}


ALGORITHMS.register("gkd", Algorithm(trainer="distill", data="conversation", loss=batch_loss,
                                     defaults={"beta": 0.5}, flags=COMMON_FLAGS | SAMPLING_FLAGS | {
                                         "beta", "teacher_model", "seq_kd", "lmbda", "sft_alpha"}))

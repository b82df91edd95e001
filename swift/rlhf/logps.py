"""Per-token and per-sequence log-probabilities of labelled tokens."""
from __future__ import annotations

import torch

IGNORE_INDEX = -100


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sum of log p(label) per sequence, number of labelled tokens, per-token log p), labels shifted by one."""
    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    per_token = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    return per_token.sum(-1), mask.sum(-1), per_token

"""Per-token and per-sequence log-probabilities of labelled tokens."""
from __future__ import annotations

import torch

IGNORE_INDEX = -100


def target_logps(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits[b, t] predicts targets[b, t]: (per-sequence sum of log p, labelled-token count, per-token log p)."""
    mask = targets != IGNORE_INDEX
    logp = torch.log_softmax(logits.float(), dim=-1)
    per_token = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    return per_token.sum(-1), mask.sum(-1), per_token


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`target_logps` for full-sequence logits and unshifted labels (logits[t] predicts labels[t+1])."""
    return target_logps(logits[:, :-1], labels[:, 1:])


def labelled_positions(labels: torch.Tensor) -> torch.Tensor:
    """Sequence positions t whose next label is set in some row: the only logits a loss needs."""
    return (labels[:, 1:] != IGNORE_INDEX).any(dim=0).nonzero().squeeze(-1)

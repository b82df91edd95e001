"""Process reward model (Math-Shepherd, arXiv 2312.08935; TRL's PRM recipe): a token classifier that
labels each reasoning step as correct or not at the token that ends the step (its separator).

loss = mean cross-entropy over step-end tokens; every other token is ignored (label −100).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from swift.rlhf.base import ALGORITHMS, COMMON_FLAGS, Algorithm
from swift.rlhf.logps import IGNORE_INDEX


def step_loss(logits: torch.Tensor, labels: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
    """`logits` [B, T, 2], `labels` [B, T] with 0/1 at step ends, −100 elsewhere; the mean over
    `tokens` step ends (the optimizer step's, per micro-batch and rank), by default this batch's."""
    total = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1),
                            ignore_index=IGNORE_INDEX, reduction="sum")
    return total / (tokens if tokens is not None else (labels != IGNORE_INDEX).sum()).clamp(min=1)


def batch_loss(logits: torch.Tensor, batch: dict, a) -> tuple[torch.Tensor, dict]:
    labels = batch["labels"]
    counts = batch.get("token_counts")
    loss = step_loss(logits, labels, counts[2] if counts is not None else None)
    steps = labels != IGNORE_INDEX
    predicted = logits.detach().argmax(-1)
    return loss, {"step_accuracy": (predicted[steps] == labels[steps]).float().mean().item()}


ALGORITHMS.register("prm", Algorithm(trainer="classifier", data="steps", loss=batch_loss, task_type="token_cls",
                                     num_labels=2, flags=COMMON_FLAGS | {"step_separator"}))

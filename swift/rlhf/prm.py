"""Process reward model (Math-Shepherd, arXiv 2312.08935; TRL's PRM recipe): a token classifier that
labels each reasoning step as correct or not at the token that ends the step (its separator).

loss = mean cross-entropy over step-end tokens; every other token is ignored (label −100).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from swift.rlhf.base import ALGORITHMS, COMMON_FLAGS, Algorithm
from swift.rlhf.logps import IGNORE_INDEX
from swift.rlhf.reduce import Terms


def batch_loss(logits: torch.Tensor, batch: dict, a) -> tuple[Terms, dict]:
    """`logits` [B, T, 2], `labels` [B, T] with 0/1 at step ends, −100 elsewhere: the cross-entropy
    summed over step ends (a `tokens` term: the mean over the step's step ends)."""
    labels = batch["labels"]
    total = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1),
                            ignore_index=IGNORE_INDEX, reduction="sum")
    steps = labels != IGNORE_INDEX
    predicted = logits.detach().argmax(-1)
    return {"tokens": total}, {"step_accuracy": (predicted[steps] == labels[steps]).float().mean().item()}


ALGORITHMS.register("prm", Algorithm(trainer="classifier", data="steps", loss=batch_loss, task_type="token_cls",
                                     num_labels=2, flags=COMMON_FLAGS | {"step_separator"}))

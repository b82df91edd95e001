"""Reward model: a value head trained with the Bradley–Terry loss (InstructGPT, arXiv 2203.02155).

With scalar rewards r_w, r_l of the chosen and rejected answers and an optional per-pair margin m
(Llama 2, arXiv 2307.09288):  loss = mean over pairs of −log σ(r_w − r_l − m) + c · (r_w + r_l)²,
c = `--center_rewards_coefficient` (keeps rewards centred on zero, arXiv 2312.09244).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from swift.rlhf.base import ALGORITHMS, COMMON_FLAGS, Algorithm
from swift.rlhf.reduce import Terms


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None,
                       center_rewards_coefficient: float | None = None) -> torch.Tensor:
    """Each pair's loss ([pairs])."""
    diff = chosen - rejected if margin is None else chosen - rejected - margin
    loss = -F.logsigmoid(diff)
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * (chosen + rejected) ** 2
    return loss


def batch_loss(logits: torch.Tensor, batch: dict, a) -> tuple[Terms, dict]:
    """`logits` [2B, 1]: rows are [chosen..., rejected...]."""
    rewards = logits.float().squeeze(-1)
    n = rewards.size(0) // 2
    chosen, rejected = rewards[:n], rewards[n:]
    terms = {"pairs": bradley_terry_loss(chosen, rejected, batch.get("margin"), a.center_rewards_coefficient).sum()}
    d = rewards.detach()
    metrics = {"accuracy": (d[:n] > d[n:]).float().mean().item(), "margin": (d[:n] - d[n:]).mean().item(),
               "mean_reward": d.mean().item(), "min_reward": d.min().item(), "max_reward": d.max().item()}
    return terms, metrics


ALGORITHMS.register("rm", Algorithm(trainer="classifier", data="pair", loss=batch_loss, task_type="seq_cls",
                                    num_labels=1, flags=COMMON_FLAGS | {"center_rewards_coefficient"}))

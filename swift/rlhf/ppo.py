"""PPO with a learned critic (Schulman et al. 2017; the RLHF recipe of Ziegler et al. 2019 and TRL's
last PPOTrainer): per-token rewards, GAE, the clipped value loss and the KL controller.

Completions are [B, T] with a `mask` that is 1 on each completion's tokens (a prefix: right padding
after). The sequence score r (reward functions / reward model, after `--missing_eos_penalty` and
`--reward_clip_range`) goes on the completion's last token and every token the policy sampled pays
the KL penalty:
    reward_t = −β KL_t + [t = last] r,      KL_t = k1: log π_old(t) − log π_ref(t)  (or k2/k3)
GAE with discount γ and λ (a finished or truncated completion ends the episode: V after the last
token is 0):
    δ_t = reward_t + γ V_{t+1} − V_t,   A_t = Σ_k (γλ)^k δ_{t+k},   returns R_t = A_t + V_t
The advantages are whitened over the generation batch's tokens (all ranks); with `--whiten_rewards`
the per-token rewards are scaled the same way first, keeping their mean (as TRL does).
Value loss, with V_old the critic's values at sampling and c = `--cliprange_value`:
    ½ max((V − R)², (V_old + clip(V − V_old, −c, c) − R)²), aggregated like the policy loss.
Policy and value losses are token means over the optimizer step's tokens (all micro-batches and
ranks: `--loss_type dapo`, the default here), which is TRL's micro-batch token mean when there is one
micro-batch, and does not change with gradient accumulation or the number of ranks.
The KL coefficient β is fixed, or adaptive with `--kl_target` (Ziegler et al. 2019):
    β ← β (1 + clip(KL / target − 1, −0.2, 0.2) · n / horizon), n = sequences in the batch,
    KL = mean over sequences of Σ_t KL_t.
"""
from __future__ import annotations

import torch

from swift.rlhf.base import ALGORITHMS, ROLLOUT_FLAGS, Algorithm
from swift.rlhf.grpo import LOSS_TYPES, UNREAD_BY_LOSS_TYPES, global_token_mean, policy_loss
from swift.rlhf.reduce import Terms

WHITEN_EPS = 1e-8


def token_rewards(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """−β·KL on every completion token, plus the sequence score on its last one ([B] scores, [B, T] rest)."""
    rewards = -kl_coef * kl * mask
    last = mask.sum(-1).long() - 1
    rows = torch.nonzero(last >= 0).squeeze(-1)  # a completion with no token gets no score
    rewards[rows, last[rows]] += scores[rows].to(rewards.dtype)
    return rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns ([B, T]) by generalised advantage estimation; 0 outside `mask`."""
    rewards, values = rewards * mask, values * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        following = values[:, t + 1] if t + 1 < rewards.size(1) else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * following - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    return advantages * mask, (advantages + values) * mask


def moments(tensors: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
    """[Σx, Σx², n] over the masked entries of several [B, T] tensors (summed over ranks by the caller)."""
    return torch.stack([sum((x * m).sum() for x, m in zip(tensors, masks)),
                        sum((x * x * m).sum() for x, m in zip(tensors, masks)),
                        sum(m.sum() for m in masks)]).double()


def mean_and_var(stats: torch.Tensor) -> tuple[float, float]:
    """The mean and the Bessel-corrected variance of `stats` (from `moments`)."""
    total, squares, n = stats.tolist()
    mean = total / max(n, 1)
    return mean, max(squares / max(n, 1) - mean * mean, 0.0) * (n / (n - 1) if n > 1 else 1.0)


def whiten(x: torch.Tensor, mask: torch.Tensor, stats: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x − mean) / sqrt(var + 1e-8) with the mean and the Bessel-corrected variance of `stats`
    (from `moments`); with shift_mean=False the mean is added back. 0 outside `mask`."""
    mean, var = mean_and_var(stats)
    out = (x - mean) / (var + WHITEN_EPS) ** 0.5
    if not shift_mean:
        out = out + mean
    return out * mask


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *,
               cliprange_value: float, aggregate=global_token_mean,
               **aggregate_kwargs) -> tuple[Terms, torch.Tensor]:
    """The clipped value loss's terms (aggregated over tokens like the policy loss, `swift.rlhf.reduce`)
    and its per-token clipped flags (where the clipped term is the larger)."""
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss, clipped_loss = (values - returns) ** 2, (clipped - returns) ** 2
    per_token = 0.5 * torch.max(unclipped_loss, clipped_loss)
    return aggregate(per_token, mask, **aggregate_kwargs), clipped_loss > unclipped_loss


class KLController:
    """The KL coefficient β: fixed, or adaptive towards `target` (Ziegler et al. 2019)."""

    def __init__(self, init: float, target: float | None = None, horizon: int = 10000):
        self.value, self.target, self.horizon = init, target, horizon

    def update(self, current: float, n_steps: int) -> None:
        if self.target is None:
            return
        error = min(max(current / self.target - 1, -0.2), 0.2)
        self.value *= 1 + error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


ALGORITHMS.register("ppo", Algorithm(
    trainer="rollout", data="prompt", loss=policy_loss, reference=True, critic=True,
    defaults={"beta": 0.05, "loss_type": ["dapo"], "kl_estimator": "k1", "num_generations": 1,
              "advantage_estimator": "gae", "num_iterations": 4, "epsilon": 0.2, "gamma": 1.0, "lam": 0.95,
              "vf_coef": 0.1, "cliprange_value": 0.2, "kl_horizon": 10000},
    loss_types=LOSS_TYPES, flags=ROLLOUT_FLAGS | {
        "critic_model", "critic_backbone", "critic_learning_rate", "num_mini_batches", "kl_target", "kl_horizon",
        "cliprange_value", "vf_coef", "gamma", "lam", "whiten_rewards", "missing_eos_penalty", "reward_clip_range"},
    unread_by_loss_types=UNREAD_BY_LOSS_TYPES))

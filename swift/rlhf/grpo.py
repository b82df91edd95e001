"""GRPO family: advantage estimators, the clipped policy loss and its aggregations, KL estimators.

Rewards arrive as a flat tensor of P prompts × G generations (prompt-major) and are viewed [P, G].
A NaN reward (every reward function returned None for the row) is left out of the means and stds
and gets a NaN advantage; the trainer leaves such rows out of the loss.

Advantages (`--advantage_estimator`), each as the peer that names it computes it; then
`--scale_rewards group|batch|none` divides by a std + 1e-4 (Bessel-corrected), of the rewards or of
the centred advantages as that peer does:
  grpo (arXiv 2402.03300):  r − mean_g; ÷ the group's (default) or batch's reward std (TRL, ms-swift)
  dr_grpo (arXiv 2503.20783):  r − mean_g; not scaled by default (÷ reward std if asked)
  rloo (arXiv 2402.14740):  r − (sum_g − r) / (G − 1), 0 for a row no other row of its group was
      scored with; not scaled by default (÷ reward std if asked)
  reinforce_plus_plus (ms-swift):  r − mean_g; ÷ the batch's (default) or group's std of those
      centred values (REINFORCE++ with a group baseline, arXiv 2501.03262)
  reinforce_baseline (OpenRLHF):  r − mean_g; not scaled by default; `batch` ÷ the batch std of the
      centred values, which is OpenRLHF's whitening (their batch mean is 0)
  reinforce (OpenRLHF's REINFORCE++):  r whitened over the batch, (r − mean_b) / (std_b + 1e-4); it
      is scaled already, so `--scale_rewards group|batch` is refused (it would divide by a std twice)

Policy loss per completion token t, with ratio w_t = exp(log π(t) − log π_old(t)) (token level) or
the sequence's geometric-mean ratio (`--importance_sampling_level sequence`, GSPO arXiv 2507.18071):
  ℓ_t = −min(w_t A, clip(w_t, 1 − ε, 1 + ε_high) A) + β KL_t
with KL_t = k3 = e^(ref − logp) − (ref − logp) − 1 (k1 = logp − ref, k2 = ½ (logp − ref)²).
`--delta` (two-sided clipping, INTELLECT-2 arXiv 2505.07291) also caps w_t at δ in the unclipped
term, so a negative advantage cannot push a token's loss up without bound.
Two loss types replace the clipped surrogate (ms-swift's and TRL's `--loss_type`):
  cispo (MiniMax-M1 arXiv 2506.13585): ℓ_t = −sg(min(w_t, ε_max)) A log π(t), with ε_max =
      `--epsilon_high` (an absolute cap on the weight, 5.0 when not given): clipped tokens keep a gradient.
  sapo (arXiv 2511.20347): ℓ_t = −(4/τ) σ(τ (w_t − 1)) A, τ = `--tau_pos` where A > 0 else `--tau_neg`:
      a soft gate whose gradient fades smoothly as w_t leaves 1.
Aggregation (`--loss_type`), over the optimizer step (all its micro-batches and ranks, `swift.rlhf.reduce`):
grpo and sapo = mean over each sequence's tokens then over all sequences (those that carry no loss
too, as TRL); dr_grpo = sum / (sequences × max_completion_length); dapo and cispo = sum / tokens
(arXiv 2503.14476); bnpo = mean over each micro-batch's tokens, then over the micro-batches: TRL's
definition, the one aggregation that depends on how the step is split (gradient accumulation, ranks).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from swift.rlhf.base import ALGORITHMS, ROLLOUT_FLAGS, Algorithm
from swift.rlhf.reduce import Terms
from swift.utils.dist import gather_cat
from swift.utils.registry import Registry
from swift.plugin import register

EPS = 1e-4
ADVANTAGE_ESTIMATORS: Registry[Callable[[torch.Tensor], torch.Tensor]] = Registry("advantage estimator")
DEFAULT_SCALE = {"grpo": "group", "reinforce_plus_plus": "batch"}  # the others: none unless asked
# what --scale_rewards takes the std of: the rewards (TRL; ms-swift's grpo and rloo) or the centred
# advantages (ms-swift's reinforce_plus_plus, OpenRLHF's reinforce_baseline); None: already scaled
SCALE_OF = {"grpo": "rewards", "dr_grpo": "rewards", "rloo": "rewards", "reinforce_plus_plus": "advantages",
            "reinforce_baseline": "advantages", "reinforce": None}


def nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sample standard deviation (Bessel-corrected, as torch.std) of the values that are not NaN;
    0 where fewer than two are."""
    if dim is None:
        x, dim = x.reshape(-1), 0
    count = (~x.isnan()).sum(dim=dim, keepdim=True)
    squares = ((x - x.nanmean(dim=dim, keepdim=True)) ** 2).nansum(dim=dim, keepdim=True)
    return (squares / (count - 1).clamp(min=1)).sqrt()


@register("advantage_estimator", "grpo")
@register("advantage_estimator", "dr_grpo")
@register("advantage_estimator", "reinforce_plus_plus")
@register("advantage_estimator", "reinforce_baseline")
def group_baseline(rewards: torch.Tensor) -> torch.Tensor:
    """r − mean over the group; rewards [P, G]."""
    return rewards - rewards.nanmean(dim=1, keepdim=True)


@register("advantage_estimator", "rloo")
def leave_one_out(rewards: torch.Tensor) -> torch.Tensor:
    """r − mean of the other (scored) rewards of the group; 0 for a row with no other scored row
    (no baseline to compare with, as the group-mean estimators give it)."""
    count = (~rewards.isnan()).sum(dim=1, keepdim=True)
    advantages = rewards - (rewards.nansum(dim=1, keepdim=True) - rewards) / (count - 1).clamp(min=1)
    return torch.where(count < 2, advantages * 0, advantages)  # * 0 keeps an unscored row's NaN


@register("advantage_estimator", "reinforce")
def batch_whitened(rewards: torch.Tensor) -> torch.Tensor:
    """(r − batch mean) / (batch std + 1e-4)."""
    return (rewards - rewards.nanmean()) / (nanstd(rewards) + EPS)


def scale_for(estimator: str, scale_rewards: str | None) -> str:
    """The `--scale_rewards` that applies: the estimator's default when not given; a scaling of an
    estimator that is scaled already is refused."""
    scale = scale_rewards or DEFAULT_SCALE.get(estimator, "none")
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be group, batch or none, got {scale!r}")
    if SCALE_OF.get(estimator, "rewards") is None and scale != "none":
        raise ValueError(f"--advantage_estimator {estimator} whitens the rewards over the batch already; "
                         f"--scale_rewards {scale} would divide by a std twice (give none, or leave it out)")
    return scale


def compute_advantages(rewards: torch.Tensor, num_generations: int, estimator: str = "grpo",
                       scale_rewards: str | None = None) -> torch.Tensor:
    """Flat rewards [P·G] → flat advantages [P·G]."""
    grouped = rewards.view(-1, num_generations)
    advantages = ADVANTAGE_ESTIMATORS.get(estimator)(grouped)
    scale = scale_for(estimator, scale_rewards)
    of = grouped if SCALE_OF.get(estimator, "rewards") == "rewards" else advantages
    if scale == "group" and num_generations > 1:
        advantages = advantages / (nanstd(of, dim=1) + EPS)
    elif scale == "batch" and rewards.numel() > 1:
        advantages = advantages / (nanstd(of) + EPS)
    return advantages.reshape(-1)


def kl_estimate(logps: torch.Tensor, ref_logps: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL(π ‖ π_ref) estimators (Schulman 2020): k1, k2, k3 (unbiased, non-negative)."""
    d = ref_logps - logps
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d ** 2
    return torch.exp(d) - d - 1


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """Keep the `top_quantile` highest-entropy completion tokens (arXiv 2506.01939); the threshold
    is the quantile over every rank's tokens."""
    values = gather_cat(entropies[mask.bool()].float())
    if values.numel() == 0:
        return torch.zeros_like(mask, dtype=torch.bool)
    threshold = torch.quantile(values, 1 - top_quantile)
    return (entropies * mask >= threshold) & mask.bool()


# The aggregations: each returns its term of the step's loss (`swift.rlhf.reduce`), a sum over this
# micro-batch and the kind of count the step divides it by.
def per_sequence_mean(loss: torch.Tensor, mask: torch.Tensor, **_) -> Terms:
    """Mean over each row's tokens, then over every row of the step, also rows that carry no loss
    (unscored, overlong-filtered), as TRL does."""
    return {"rows": ((loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum()}


def token_mean(loss: torch.Tensor, mask: torch.Tensor, **_) -> Terms:
    """bnpo: the micro-batch's token mean (TRL's definition), averaged over the step's micro-batches."""
    return {"micro_batches": (loss * mask).sum() / mask.sum().clamp(min=1)}


def constant_normalizer(loss: torch.Tensor, mask: torch.Tensor, *, max_completion_length: int, **_) -> Terms:
    """dr_grpo: the sum over the step's tokens / (the step's rows × max_completion_length), as TRL."""
    return {"rows": (loss * mask).sum() / max_completion_length}


def global_token_mean(loss: torch.Tensor, mask: torch.Tensor, **_) -> Terms:
    """dapo, cispo: the sum over the step's tokens / its tokens."""
    return {"tokens": (loss * mask).sum()}


CISPO_DEFAULT_CAP = 5.0  # ScaleRL's recommended ε_max for cispo when --epsilon_high is not given


Surrogate = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # per-token loss, low-clipped, high-clipped flags


def clipped_surrogate(ratio: torch.Tensor, logps: torch.Tensor, adv: torch.Tensor, *, epsilon: float,
                      epsilon_high: float | None, delta: float | None, **_) -> Surrogate:
    """PPO's −min(w A, clip(w, 1 − ε, 1 + ε_high) A); with δ, w is first capped at δ in the first term.
    Returns the per-token loss and the low/high clipped flags."""
    high = epsilon if epsilon_high is None else epsilon_high
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + high)
    unclipped = ratio if delta is None else ratio.clamp(max=delta)
    per_token = -torch.min(unclipped * adv, clipped * adv)
    return per_token, (ratio < 1 - epsilon) & (adv < 0), (ratio > 1 + high) & (adv > 0)


def cispo_surrogate(ratio: torch.Tensor, logps: torch.Tensor, adv: torch.Tensor, *, epsilon_high: float | None,
                    **_) -> Surrogate:
    cap = CISPO_DEFAULT_CAP if epsilon_high is None else epsilon_high
    per_token = -ratio.clamp(max=cap).detach() * adv * logps
    return per_token, torch.zeros_like(ratio, dtype=torch.bool), (ratio > cap) & (adv > 0)


def sapo_surrogate(ratio: torch.Tensor, logps: torch.Tensor, adv: torch.Tensor, *, tau_pos: float, tau_neg: float,
                   **_) -> Surrogate:
    tau = torch.where(adv > 0, torch.as_tensor(tau_pos, dtype=ratio.dtype), torch.as_tensor(tau_neg, dtype=ratio.dtype))
    per_token = -torch.sigmoid(tau * (ratio - 1)) * (4 / tau) * adv
    no_flags = torch.zeros_like(ratio, dtype=torch.bool)
    return per_token, no_flags, no_flags


@dataclass(frozen=True)
class LossType:
    """A `--loss_type`: the per-token objective (a surrogate of the ratio and advantage) and how the
    tokens' losses are averaged into the step's loss."""

    surrogate: Callable[..., Surrogate]
    aggregate: Callable[..., Terms]


LOSS_TYPES: Registry[LossType] = Registry("GRPO loss type")
register("loss_type", "grpo", LossType(clipped_surrogate, per_sequence_mean))
register("loss_type", "bnpo", LossType(clipped_surrogate, token_mean))
register("loss_type", "dr_grpo", LossType(clipped_surrogate, constant_normalizer))
register("loss_type", "dapo", LossType(clipped_surrogate, global_token_mean))
register("loss_type", "cispo", LossType(cispo_surrogate, global_token_mean))
register("loss_type", "sapo", LossType(sapo_surrogate, per_sequence_mean))


def policy_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                epsilon: float = 0.2, epsilon_high: float | None = None, delta: float | None = None,
                tau_pos: float = 1.0, tau_neg: float = 1.05, beta: float = 0.0,
                ref_logps: torch.Tensor | None = None, kl_type: str = "k3", importance_sampling_level: str = "token",
                loss_type: str = "grpo", max_completion_length: int | None = None,
                token_weights=None) -> tuple[Terms, dict[str, torch.Tensor]]:
    """The policy objective of every completion token ([B, T] tensors; `advantages` [B], or [B, T]), aggregated by
    `loss_type`. `token_weights` (e.g. the high-entropy mask) multiply the policy term. Returns the loss's
    terms (`swift.rlhf.reduce`) and per-token diagnostics (ratio, clipped flags, kl)."""
    log_ratio = logps - old_logps
    if importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1)
    elif importance_sampling_level != "token":
        raise ValueError(f"importance_sampling_level must be token or sequence, got {importance_sampling_level!r}")
    ratio = torch.exp(log_ratio)
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # per sequence, or per token (PPO)
    kind = LOSS_TYPES.get(loss_type)
    per_token, low_clipped, high_clipped = kind.surrogate(ratio, logps, adv, epsilon=epsilon, epsilon_high=epsilon_high,
                                                     delta=delta, tau_pos=tau_pos, tau_neg=tau_neg)
    per_token = per_token.expand_as(logps)
    if token_weights is not None:
        per_token = per_token * token_weights
    kl = None
    if beta:
        kl = kl_estimate(logps, ref_logps, kl_type)
        per_token = per_token + beta * kl
    terms = kind.aggregate(per_token, mask, max_completion_length=max_completion_length)
    info = {"ratio": ratio.expand_as(logps), "low_clipped": low_clipped.expand_as(logps),
            "high_clipped": high_clipped.expand_as(logps), "kl": kl}
    return terms, info


# the flags some built-in loss types do not read: cispo caps the weight at --epsilon_high alone, sapo
# gates it softly (--tau_pos / --tau_neg) instead of clipping (ms-swift, TRL read them the same way)
CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo")
UNREAD_BY_LOSS_TYPES = {"epsilon": ("cispo", "sapo"), "epsilon_high": ("sapo",),
                        "tau_pos": (*CLIPPED, "cispo"), "tau_neg": (*CLIPPED, "cispo")}

ALGORITHMS.register("grpo", Algorithm(
    trainer="rollout", data="prompt", loss=policy_loss, reference=True,
    defaults={"beta": 0.04, "loss_type": ["grpo"], "kl_estimator": "k3", "num_generations": 8,
              "advantage_estimator": "grpo", "num_iterations": 1, "epsilon": 0.2},
    loss_types=LOSS_TYPES, flags=ROLLOUT_FLAGS | {"scale_rewards", "dynamic_sample", "max_resample_times", "kl_in_reward"},
    unread_by_loss_types=UNREAD_BY_LOSS_TYPES))


def rollout_importance_weights(old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, mode: str,
                               threshold: float):
    """Per-token weights π_old/π_sampler for tokens sampled by older weights (or another engine; NaN
    in `sampling` where unknown), truncated (`token_truncate`) or masked (`token_mask`) at the
    threshold, or none; and their metrics (TRL's names)."""
    known = ~sampling.isnan() & (mask > 0)
    diff = torch.where(known, old.detach() - sampling.nan_to_num(0.0), torch.zeros_like(old))
    ratio = diff.exp()
    metrics = {}
    if known.any():
        r, d = ratio[known], diff[known].abs()
        metrics = {"sampling/sampling_logp_difference/mean": d.mean().item(),
                   "sampling/sampling_logp_difference/max": d.max().item(),
                   "sampling/importance_sampling_ratio/min": r.min().item(),
                   "sampling/importance_sampling_ratio/mean": r.mean().item(),
                   "sampling/importance_sampling_ratio/max": r.max().item()}
    if mode == "token_truncate":
        return ratio.clamp(max=threshold), metrics
    if mode == "token_mask":
        return torch.where(ratio <= threshold, ratio, torch.zeros_like(ratio)), metrics
    return None, metrics

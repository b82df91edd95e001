"""Harmlessness training, RePULSe (arXiv 2510.21184): make low-reward ("bad") outputs rarer with a
learned proposal q that samples them.

Models: pθ (trained), p0 (frozen start, for the KL), q (the proposal). r(s) is the reward (higher
is better). The proposal learns the target σ(s|x) ∝ pθ(s|x)·φ(s), log φ = β r (β < 0,
`--target_dist_beta`) or log φ = log(1[r < τ] + 1e-16) (`--rm_type indicator_below_threshold`).
For each prompt, N samples from pθ and N from q (all tensors below are prompt-major, P·N rows).

pθ's loss (`--harmlessness_training_loss_type neg_training`), each sequence's masked token mean
written mean_t:
    R_i = r'(s_i) − λ Σ_t [log pθ_old(s_i,t) − log p0(s_i,t)]          (k1 KL in the return)
    b_i = (Σ_j R_j − R_i) / (N − 1)                                       (RLOO; `none`: 0)
    L_RL = mean_{p,i} (R_i − b_i) · mean_t[−log pθ(s_i,t)]
    w̄_i = softmax_i(Σ_t log pθ(s'_i,t) + log φ(s'_i) − Σ_t log q_old(s'_i,t)),  s' ~ q   (detached)
    L_neg = mean_{p,i} w̄_i · mean_t[log pθ(s'_i,t)]                     (the mean over P·N: a 1/N)
    L = L_RL + α L_neg
with r' = r, r − a·e^{b r} or r − a·1[r < τ] (`--reward_transform`). With the indicator, w̄ is 0
where φ ≤ 2e-16 (not renormalised). `--use_base_as_proposal`: s' are pθ's own samples (q_old =
pθ_old, so w̄ = softmax(β r)). `reinforce`: L = L_RL.

`neg_reinforce` (the fork's third loss) replaces L_neg by a REINFORCE term on q's samples whose
return keeps its gradient:
    R'_i = log φ(s'_i) − λ Σ_t [log pθ(s'_i,t) − log p0(s'_i,t)]          (pθ not detached)
    L_neg = mean_{p,i} w̄_i · mean_t[−log pθ(s'_i,t)] · (R'_i − b'_i)
with b' = 0, the leave-one-out mean of R' (`expectation`), a constant (`hardcoded`) or the mean of the
prompt's pθ-sample returns (`other_expectation`), and w̄ as above without the indicator's zeroing.
Descending it raises log pθ where R' is above the baseline, the bad samples when β < 0: it lowers
them only with α < 0 (the arguments refuse α ≥ 0).

q's loss (`--actor_loss_type ctl`), per token log ψ_t = log q(s'_t) − log pθ(s'_t) (pθ detached;
`policy_psi_q_p_s_1_to_t`: summed over t' ≤ t):
    w^σ_i = softmax_i(Σ_t log pθ + log φ − Σ_t log q_old)
    w^π_i,t = softmax_i(Σ_{t'≤t} log pθ + log ψ_t − Σ_{t'≤t} log q_old)       (both detached)
    L_CTL = −mean_{p,i} mean_t[(w^σ_i − w^π_i,t) · log ψ_t]
`ctl_nosecondterm` drops w^π; `dpg` (`--parameterization policy`): −mean_{p,i} w^σ_i · mean_t[log q].
The modulation parameterisations (`modulation_linear_head`, `modulation_nn_head`: a head m on pθ's
last hidden state; `modulation_model`: m the logits of a second model) define q by
log q = log_softmax(log_softmax(pθ's logits) + m) with pθ detached, and their twist is m's own value
at the sampled token, log ψ_t = m_t(s_t) (m_t/T at a sampling temperature T).

Every function here takes the rows of whole prompt groups and returns sums over its rows (the
trainer divides by the P·N rows of the step: `swift.rlhf.reduce`)."""
from __future__ import annotations

import torch

from swift.rlhf.base import ALGORITHMS, COMMON_FLAGS, REFERENCE_FLAGS, SAMPLING_FLAGS, Algorithm
from swift.rlhf.grpo import LOSS_TYPES, leave_one_out
from swift.rlhf.reduce import Terms

INDICATOR_EPS = 1e-16  # log φ of a good sample under the indicator: log(1e-16) ≈ −36.8
ZERO_WEIGHT_BELOW = 2 * INDICATOR_EPS  # the indicator's zeroed weights: φ at or below this


def log_phi(rewards: torch.Tensor, beta: float, rm_type: str = "rlhf", threshold: float = -5.0) -> torch.Tensor:
    """log φ(s) of the target σ ∝ pθ·φ; NaN where the row has no reward."""
    if rm_type == "indicator_below_threshold":
        bad = (rewards < threshold).to(torch.float64)
        return torch.where(rewards.isnan(), rewards.double(), torch.log(bad + INDICATOR_EPS)).to(rewards.dtype)
    return beta * rewards


def transform_rewards(rewards: torch.Tensor, kind: str | None, a: float, b: float | None,
                      threshold: float) -> torch.Tensor:
    """The policy's reward r' (`--reward_transform`): r, r − a·e^{b r} or r − a·1[r < τ]."""
    if kind is None:
        return rewards
    if kind == "minus_alpha_exp_beta_r":
        return rewards - a * torch.exp(b * rewards)
    if kind == "minus_alpha_ind":
        return rewards - a * (rewards < threshold).to(rewards.dtype)
    raise ValueError(f"unknown reward transform {kind!r}")


def group_softmax(logits: torch.Tensor, n: int) -> torch.Tensor:
    """Softmax over each prompt's n rows ([P·n] or [P·n, T], over the rows); rows with a NaN logit
    get weight 0, and a group with none left gets 0 everywhere."""
    grouped = logits.reshape(-1, n, *logits.shape[1:])
    grouped = grouped.masked_fill(grouped.isnan(), float("-inf"))
    return grouped.softmax(dim=1).nan_to_num(0.0).reshape(logits.shape)


def returns_and_advantages(rewards: torch.Tensor, kl_sums: torch.Tensor | None, kl_coef: float, n: int,
                           baseline: str = "expectation") -> tuple[torch.Tensor, torch.Tensor]:
    """R = r' − λ·Σ_t KL_t and R − b (RLOO over the other scored rows of the prompt, or no baseline);
    NaN rewards give advantage 0."""
    returns = rewards if kl_sums is None or not kl_coef else rewards - kl_coef * kl_sums.to(rewards)
    if baseline == "expectation":
        advantages = leave_one_out(returns.view(-1, n)).reshape(-1)
    else:
        advantages = returns
    return returns, advantages.nan_to_num(0.0)


def negative_weights(policy_sums: torch.Tensor, phi: torch.Tensor, proposal_sums: torch.Tensor, n: int, *,
                     indicator_phi: torch.Tensor | None = None, uniform: bool = False) -> torch.Tensor:
    """w̄ = softmax over each prompt's samples of log pθ(s') + log φ(s') − log q_old(s') (1/N each with
    `uniform`); 0 for unscored rows, and with the indicator target (its log φ: `indicator_phi`, which
    `--separate_reweighting_beta` leaves as it is) where φ ≤ 2e-16."""
    if uniform:
        weights = torch.where(phi.isnan(), torch.zeros_like(phi), torch.full_like(phi, 1.0 / n))
    else:
        weights = group_softmax(policy_sums + phi - proposal_sums, n)
    if indicator_phi is not None:
        weights = weights * (indicator_phi.nan_to_num(float("-inf")).exp() > ZERO_WEIGHT_BELOW).to(weights.dtype)
    return weights


def sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def neg_reinforce_rows(logps: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor, phi: torch.Tensor, n: int,
                       ref_logps: torch.Tensor | None = None, kl_coef: float = 0.0, baseline: str | None = None,
                       hardcoded: float | None = None, other: torch.Tensor | None = None) -> torch.Tensor:
    """Per negative: w̄ · mean_t[−log pθ] · (R' − b'), R' = log φ − λ Σ_t (log pθ − log p0) with the
    gradient through log pθ (the fork's `neg_reinforce`); unscored rows (NaN φ) give 0."""
    mask = mask.to(logps.dtype)
    scored = ~phi.isnan()
    returns = phi.nan_to_num(0.0).to(logps.dtype)
    if kl_coef:
        returns = returns - kl_coef * ((logps - ref_logps) * mask).sum(-1)
    returns = returns * scored
    if baseline == "expectation":  # leave-one-out over the prompt's other scored samples, with its gradient
        grouped, count = returns.view(-1, n), scored.view(-1, n).sum(1, keepdim=True)
        base = ((grouped.sum(1, keepdim=True) - grouped) / (count - 1).clamp(min=1)).reshape(-1)
    elif baseline == "hardcoded":
        base = torch.full_like(returns, hardcoded)
    elif baseline == "other_expectation":
        base = other.to(returns)
    else:
        base = torch.zeros_like(returns)
    return weights.to(logps.dtype) * sequence_mean(-logps, mask) * (returns - base) * scored


def policy_terms(logps: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor,
                 neg_weights: torch.Tensor | None = None, alpha: float = 0.0,
                 separate_negatives: bool = True, reinforce: dict | None = None) -> tuple[Terms, dict[str, torch.Tensor]]:
    """pθ's loss on a micro-batch: rows [pθ's B samples | the B negatives] (`separate_negatives`), or
    the B samples that are also the negatives (`--use_base_as_proposal`), or no negatives. With
    `reinforce` (the keyword arguments of `neg_reinforce_rows` but the log-probs, mask and weights)
    the negative term is `neg_reinforce`'s. Returns the terms (a sum over the micro-batch's B samples,
    divided by the step's P·N) and the parts."""
    b = advantages.numel()
    rl = advantages * sequence_mean(-logps[:b], mask[:b])
    parts = {"rl": rl.detach()}
    if neg_weights is None:
        return {"rows": rl.sum()}, parts
    neg_rows = slice(b, 2 * b) if separate_negatives else slice(0, b)
    if reinforce is not None:
        neg = neg_reinforce_rows(logps[neg_rows], mask[neg_rows], neg_weights, **reinforce)
    else:
        neg = neg_weights * sequence_mean(logps[neg_rows], mask[neg_rows])
    parts["neg"] = neg.detach()
    total = rl.sum() + alpha * neg.sum()
    return ({"pairs": total} if separate_negatives else {"rows": total}), parts


MODULATION = ("modulation_linear_head", "modulation_nn_head", "modulation_model")


def proposal_terms(q_logps: torch.Tensor, policy_logps: torch.Tensor, old_q_logps: torch.Tensor,
                   phi: torch.Tensor, mask: torch.Tensor, n: int, loss_type: str = "ctl",
                   parameterization: str = "policy_psi_q_p_s_t", twists: torch.Tensor | None = None) -> Terms:
    """q's loss on the negatives of whole prompt groups: the sum over rows of CTL (or DPG), for a
    mean over the step's P·N rows. `q_logps` carries q's gradient; the others are constants. The
    modulation parameterisations give their twists (log ψ_t = m_t at the sampled token, with its
    gradient) in `twists`."""
    mask = mask.to(q_logps.dtype)
    policy, old = (policy_logps * mask).detach(), (old_q_logps * mask).detach()
    scored = ~phi.isnan()
    w_sigma = group_softmax(policy.sum(-1) + phi - old.sum(-1), n).detach()
    if loss_type == "dpg":
        return {"rows": -(w_sigma * sequence_mean(q_logps, mask)).sum()}
    log_psi = (q_logps - policy) * mask if twists is None else twists * mask
    if parameterization == "policy_psi_q_p_s_1_to_t":
        log_psi = log_psi.cumsum(-1)
    if loss_type == "ctl_nosecondterm":
        return {"rows": -sequence_mean(w_sigma[:, None] * log_psi, mask).sum()}
    log_w_pi = policy.cumsum(-1) + log_psi.detach() - old.cumsum(-1)
    log_w_pi = log_w_pi.masked_fill(~scored[:, None], float("nan"))  # unscored rows leave both weight sets
    w_pi = group_softmax(log_w_pi, n)
    return {"rows": -sequence_mean((w_sigma[:, None] - w_pi) * log_psi, mask).sum()}


HARMLESS_FLAGS = frozenset({
    "do_harmlessness_training", "harmlessness_training_loss_type", "alpha", "target_dist_beta", "rm_type",
    "threshold", "reward_transform", "rew_trans_alpha", "rew_trans_beta", "reinforce_baseline_type",
    "actor_loss_type", "parameterization", "num_episodes", "actor_learning_rate", "proposal",
    "use_base_as_proposal", "sampling_target_updated_base", "separate_reweighting_beta", "uniform_reweight",
    "save_negdata", "save_negdata_threshold", "evaluate_on_neg_data", "neg_baseline_type", "neg_hardcoded_baseline",
    "additional_sd_divider", "init_head_from_base"})

ALGORITHMS.register("harmless", Algorithm(
    trainer="rollout", data="prompt", loss=policy_terms, reference=True, proposal=True,
    # the fork's defaults: --init_kl_coef 1 (our --beta), RLOO; 8 samples per prompt as grpo
    defaults={"beta": 1.0, "num_generations": 8, "loss_type": ["grpo"], "kl_estimator": "k1",
              "advantage_estimator": "rloo", "num_iterations": 1, "epsilon": 0.2},
    loss_types=LOSS_TYPES, flags=COMMON_FLAGS | REFERENCE_FLAGS | SAMPLING_FLAGS | HARMLESS_FLAGS | frozenset({
        "beta", "num_generations", "reward_funcs", "reward_weights", "reward_model", "reward_model_url",
        "custom_reward_function_path", "custom_reward_function_name", "environment_factory", "multi_turn_scheduler", "max_turns", "gym_env", "log_completions"})))

"""What the online loop logs about its rollouts (TRL's GRPO names), the completions file, and the
metrics of an evaluation pass."""
from __future__ import annotations

import json

import torch

from swift.rlhf.grpo import nanstd


def _scored(values: list[float]) -> torch.Tensor:
    v = torch.tensor(values)
    return v[~v.isnan()]


def rollout_metrics(rewards: torch.Tensor, per_func: list[list[float]], names: list[str], lengths: list[float],
                    truncated: list[bool], turns: list[int] | None, num_generations: int) -> dict[str, float]:
    """Rewards (mean, the groups' std, the share of groups with one reward), each function's mean and
    std over the rows it scored, and completion lengths (loss tokens), clipping and turns (multi-turn)
    of the whole generation batch (every rank's rows)."""
    out = {"reward": rewards.nanmean().item()}
    if num_generations > 1:  # the spread within groups (one completion per prompt has none)
        std = nanstd(rewards.view(-1, num_generations), dim=1).squeeze(1)
        out.update({"reward_std": std.mean().item(), "frac_reward_zero_std": (std == 0).float().mean().item()})
    for name, values in zip(names, per_func):
        v = _scored(values)
        if v.numel():
            out[f"rewards/{name}/mean"] = v.mean().item()
            out[f"rewards/{name}/std"] = v.std().item() if v.numel() > 1 else 0.0
    length = torch.tensor(lengths)
    out.update({"completions/mean_length": length.mean().item(), "completions/min_length": length.min().item(),
                "completions/max_length": length.max().item(),
                "completions/clipped_ratio": sum(truncated) / len(truncated)})
    if turns is not None:
        out["completions/mean_turns"] = sum(turns) / len(turns)
    return out


def write_completions(path: str, step: int, prompts: list[dict], trajectories, rewards: torch.Tensor,
                      advantages: torch.Tensor, names: list[str], per_func: list[list[float]],
                      num_generations: int) -> None:
    """One jsonl record per completion: prompt, completion, reward, advantage and each function's reward
    (null where unscored: NaN is not JSON)."""
    with open(path, "a") as f:
        for i, t in enumerate(trajectories):
            record = {"step": step, "prompt": prompts[i // num_generations]["messages"], "completion": t.text,
                      "reward": _number(rewards[i].item()), "advantage": _number(advantages[i].item()),
                      **{f"rewards/{name}": _number(values[i]) for name, values in zip(names, per_func)}}
            f.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")


def _number(value):
    return None if value is None or value != value else value


def eval_metrics(rewards: torch.Tensor, per_func: list[list[float]], names: list[str], trajectories,
                 prefix: str) -> dict[str, float]:
    metrics = {f"{prefix}_reward": rewards.nanmean().item()}
    for name, values in zip(names, per_func):
        v = _scored(values)
        if v.numel():
            metrics[f"{prefix}_rewards/{name}/mean"] = v.mean().item()
    metrics[f"{prefix}_completions/mean_length"] = sum(sum(t.loss_mask) for t in trajectories) / len(trajectories)
    return metrics

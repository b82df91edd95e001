"""Per-token and per-sequence log-probabilities of labelled tokens, and the pair metrics TRL logs."""
from __future__ import annotations

from dataclasses import dataclass

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


@dataclass
class SequenceLogps:
    """Log-probs of each row's labelled tokens: `sums` and `lengths` per row (shape [rows]); when an
    algorithm asks for it, also over every token of the row (`all_sums`, `all_lengths`)."""

    sums: torch.Tensor
    lengths: torch.Tensor
    all_sums: torch.Tensor | None = None
    all_lengths: torch.Tensor | None = None

    @property
    def means(self) -> torch.Tensor:
        return self.sums / self.lengths.clamp(min=1)

    def nll(self, rows: slice) -> torch.Tensor:
        """Mean negative log-likelihood over all labelled tokens of `rows` (token-weighted, as CE)."""
        return -self.sums[rows].sum() / self.lengths[rows].sum().clamp(min=1)

    def whole_sequence_nll(self, rows: slice) -> torch.Tensor:
        """Mean negative log-likelihood over every token (prompt included) of `rows`."""
        return -self.all_sums[rows].sum() / self.all_lengths[rows].sum().clamp(min=1)


def pair_metrics(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, chosen_logps: torch.Tensor,
                 rejected_logps: torch.Tensor) -> dict[str, float]:
    """TRL's names: rewards/{chosen,rejected,accuracies,margins}, logps/{chosen,rejected}."""
    c, r = chosen_rewards.detach(), rejected_rewards.detach()
    return {"rewards/chosen": c.mean().item(), "rewards/rejected": r.mean().item(),
            "rewards/accuracies": (c > r).float().mean().item(), "rewards/margins": (c - r).mean().item(),
            "logps/chosen": chosen_logps.detach().mean().item(), "logps/rejected": rejected_logps.detach().mean().item()}

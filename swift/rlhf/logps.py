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


def step_token_counts(batch: dict) -> torch.Tensor:
    """What the token-mean terms of a sequence batch average over: [labelled tokens of the chosen
    rows (the first half: pairs are collated chosen first), every token of those rows, labelled
    tokens of all rows (a token classifier's)]."""
    labels, n = batch["labels"], batch["labels"].size(0) // 2
    return torch.stack([(labels[:n, 1:] != IGNORE_INDEX).sum(), batch["attention_mask"][:n, 1:].sum(),
                        (labels != IGNORE_INDEX).sum()])


@dataclass
class SequenceLogps:
    """Log-probs of each row's labelled tokens: `sums` and `lengths` per row (shape [rows]); when an
    algorithm asks for it, also over every token of the row (`all_sums`, `all_lengths`).

    `token_counts` (`step_token_counts` of the optimizer step, per micro-batch and rank) make the
    chosen rows' NLL a mean over the whole step's tokens, as if it were one batch; without them it
    is a mean over this batch's."""

    sums: torch.Tensor
    lengths: torch.Tensor
    all_sums: torch.Tensor | None = None
    all_lengths: torch.Tensor | None = None
    token_counts: torch.Tensor | None = None

    @property
    def means(self) -> torch.Tensor:
        return self.sums / self.lengths.clamp(min=1)

    def nll(self, rows: slice) -> torch.Tensor:
        """Mean negative log-likelihood over all labelled tokens of the chosen `rows` (token-weighted, as CE)."""
        tokens = self.lengths[rows].sum() if self.token_counts is None else self.token_counts[0]
        return -self.sums[rows].sum() / tokens.clamp(min=1)

    def whole_sequence_nll(self, rows: slice) -> torch.Tensor:
        """Mean negative log-likelihood over every token (prompt included) of the chosen `rows`."""
        tokens = self.all_lengths[rows].sum() if self.token_counts is None else self.token_counts[1]
        return -self.all_sums[rows].sum() / tokens.clamp(min=1)


def pair_metrics(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, chosen_logps: torch.Tensor,
                 rejected_logps: torch.Tensor) -> dict[str, float]:
    """TRL's names: rewards/{chosen,rejected,accuracies,margins}, logps/{chosen,rejected}."""
    c, r = chosen_rewards.detach(), rejected_rewards.detach()
    return {"rewards/chosen": c.mean().item(), "rewards/rejected": r.mean().item(),
            "rewards/accuracies": (c > r).float().mean().item(), "rewards/margins": (c - r).mean().item(),
            "logps/chosen": chosen_logps.detach().mean().item(), "logps/rejected": rejected_logps.detach().mean().item()}

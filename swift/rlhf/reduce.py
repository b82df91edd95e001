"""The one place where every `swift rlhf` loss is normalised over the optimizer step.

An algorithm's loss returns its terms: for each kind of count it is divided by, the sum of its
losses over the micro-batch (`{"pairs": Σ per-pair loss, "chosen_tokens": α Σ NLL}`). Before any
forward of an optimizer step, `set_step_counts` counts every kind over all of the step's
micro-batches and ranks; `step_loss` then divides each sum by its count once:

    micro-batch loss = Σ_k S_k / N_k(step) × ranks

which the trainer uses as is (no division by the gradient-accumulation steps), and DDP, DeepSpeed
and FSDP average over ranks: the gradient of the step is that of Σ_k S_k(step) / N_k(step), the
loss of the step's batch taken whole, however it is split into micro-batches and ranks.

The kinds:
  rows             rows of the batch (online RL: completions, those that carry no loss too)
  pairs            rows / 2: chosen + rejected pairs, or KTO's completions (each with a mismatched one)
  tokens           loss tokens: `loss_mask` (online RL), else the labelled positions (shifted for
                   a causal LM, as they are for token classification's own labels)
  chosen_tokens    labelled tokens of the chosen rows (the first half)
  chosen_all       every token of the chosen rows, prompt included (ORPO's NLL)
  micro_batches    one per micro-batch: a term that is already a mean over its micro-batch (bnpo, as
                   TRL defines it) is averaged over the step's micro-batches, which is what gradient
                   accumulation does to it in TRL
"""
from __future__ import annotations

import torch

IGNORE_INDEX = -100
KINDS = ("rows", "pairs", "tokens", "chosen_tokens", "chosen_all", "micro_batches")
Terms = dict  # kind -> the sum of a loss over this micro-batch (a scalar tensor)


def batch_counts(batch: dict, shifted: bool = True) -> torch.Tensor:
    """Every kind's count in one micro-batch, in `KINDS` order (int64 on the CPU: HF's Trainer casts
    floating-point inputs to the model's dtype under DeepSpeed, where bf16 would round a count)."""
    ids = batch.get("loss_mask", batch.get("input_ids"))
    rows = ids.size(0)
    counts = dict.fromkeys(KINDS, 0)
    counts.update(rows=rows, pairs=rows // 2, micro_batches=1)
    if "loss_mask" in batch:
        counts["tokens"] = batch["loss_mask"].sum()
    elif "labels" in batch:
        labels = batch["labels"][:, 1:] if shifted else batch["labels"]
        counts["tokens"] = (labels != IGNORE_INDEX).sum()
        counts["chosen_tokens"] = (labels[:rows // 2] != IGNORE_INDEX).sum()
        counts["chosen_all"] = batch["attention_mask"][:rows // 2, 1:].sum()
    return torch.tensor([int(counts[k]) for k in KINDS], dtype=torch.long)


def set_step_counts(batches: list[dict], accelerator, per_step: int | None = None, shifted: bool = True) -> None:
    """Give each micro-batch the counts of its optimizer step (`step_counts`): the sum over the step's
    micro-batches (`per_step` consecutive ones; all of them by default) and over every rank. Every
    rank calls this at the same point with the same number of batches."""
    if not batches:
        return
    per_step = per_step or len(batches)
    counts = torch.stack([batch_counts(b, shifted) for b in batches])
    totals = counts.view(-1, per_step, len(KINDS)).sum(1)
    if accelerator.num_processes > 1:
        totals = accelerator.reduce(totals.to(accelerator.device), reduction="sum").cpu()
    for i, batch in enumerate(batches):
        batch["step_counts"] = totals[i // per_step]


def divide(terms: Terms, counts: torch.Tensor) -> torch.Tensor:
    """Σ_k S_k / N_k (a count of 0 goes with a sum of 0: divided by 1)."""
    total = None
    for kind, value in terms.items():
        part = value.float() / max(float(counts[KINDS.index(kind)]), 1.0)
        total = part if total is None else total + part
    if total is None:
        raise ValueError("a loss returned no terms")
    return total


def step_loss(terms: Terms, batch: dict, num_processes: int, shifted: bool = True,
              training: bool = True) -> torch.Tensor:
    """A training micro-batch's share of its step's loss (× ranks, which DDP averages away); in
    evaluation the batch's own mean."""
    counts = batch.get("step_counts")
    if counts is None:
        if training:  # a mean of this micro-batch alone would be GA× too large, and wrong across ranks
            raise RuntimeError("a training micro-batch without its optimizer step's counts (step_counts)")
        return divide(terms, batch_counts(batch, shifted))
    return divide(terms, counts) * num_processes


def logged(terms: Terms, batch: dict, shifted: bool = True) -> float:
    """A term's value for the metrics, which are averaged over the step's micro-batches and ranks:
    the step's loss when they are (its share × the number of micro-batches in the step)."""
    counts = batch.get("step_counts")
    if counts is None:
        return divide(terms, batch_counts(batch, shifted)).item()
    return divide(terms, counts).item() * float(counts[KINDS.index("micro_batches")])

"""BEAST: beam-search adversarial suffixes without gradients (Sadasivan et al., arXiv 2402.15570).

The suffix grows `ngram` tokens per step. Each of the k1 beams draws k2 distinct next tokens from
the model's own (temperature, top-p) distribution after the chat prefix, the goal and the beam (the
rest of an n-gram is sampled one token at a time); every candidate is scored by the target's mean
negative log-likelihood after it and the end of the user turn, and the k1 best become the beams.
The best suffix of any length seen is returned. Only forward passes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm import tqdm


@dataclass
class BeastConfig:
    k1: int = 15
    k2: int = 15
    length: int = 40
    ngram: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    batch_size: int = 64
    seed: int = 42


@dataclass
class AttackResult:
    suffix_ids: list[int]
    loss: float  # the target's mean NLL after the suffix
    losses: list[float]  # the best loss after each step


def filtered_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Next-token probabilities after temperature and nucleus (top-p) filtering, per row."""
    probs = (logits.float() / temperature).softmax(-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(-1, descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs > top_p  # keep the smallest set reaching top_p
        probs = probs.scatter(-1, order, sorted_probs.masked_fill(outside, 0.0))
    return probs / probs.sum(-1, keepdim=True)


class TargetLoss:
    """Mean NLL of the target after prefix + suffix + suffix-end (the end of the user turn), for
    batches of suffixes of one length."""

    def __init__(self, model, before: list[int], after: list[int], target: list[int], batch_size: int):
        self.model = model
        self.device = model.get_input_embeddings().weight.device
        self.before = torch.tensor(before, device=self.device)
        self.after = torch.tensor(after, device=self.device)
        self.target = torch.tensor(target, device=self.device)
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(self, suffixes: torch.Tensor) -> torch.Tensor:
        out = []
        for chunk in suffixes.split(self.batch_size):
            n = len(chunk)
            ids = torch.cat([self.before.expand(n, -1), chunk, self.after.expand(n, -1), self.target.expand(n, -1)], 1)
            logits = self.model(input_ids=ids).logits[:, -len(self.target) - 1:-1].float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), self.target.expand(n, -1), reduction="none")
            out.append(nll.mean(-1))
        return torch.cat(out)

    @torch.no_grad()
    def next_token_probs(self, suffixes: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
        """What the model would write next in the user turn after each suffix."""
        out = []
        for chunk in suffixes.split(self.batch_size):
            ids = torch.cat([self.before.expand(len(chunk), -1), chunk], 1)
            out.append(filtered_probs(self.model(input_ids=ids).logits[:, -1], temperature, top_p))
        return torch.cat(out)


def _draw(probs: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """k distinct tokens per row; fewer (for every row) when some row's filtered distribution has
    fewer than k tokens."""
    k = min(k, int((probs > 0).sum(-1).min()))
    return torch.multinomial(probs, k, replacement=False, generator=gen)


def beast(model, before: list[int], after: list[int], target: list[int], config: BeastConfig,
          disallowed: list[int] | None = None, typeable=None, progress: bool = True) -> AttackResult:
    """Search a suffix of up to `config.length` tokens that makes `target` likely. `typeable(ids)`:
    whether a suffix survives being decoded to text and encoded again (as a user would send it);
    candidates that do not are dropped while any other is left."""
    loss_of = TargetLoss(model, before, after, target, config.batch_size)
    device = loss_of.device
    gen = torch.Generator(device=device).manual_seed(config.seed)
    empty = torch.zeros(1, 0, dtype=torch.long, device=device)

    def probs_after(beams):
        p = loss_of.next_token_probs(beams, config.temperature, config.top_p)
        if disallowed:
            p[:, disallowed] = 0.0
            empty = p.sum(-1) == 0  # the nucleus held only control tokens: draw from the other tokens
            p[empty] = 1.0
            p[:, disallowed] = 0.0
        return p / p.sum(-1, keepdim=True)

    def extend(beams, width):
        """Each beam's `width` distinct continuations of `config.ngram` tokens."""
        first = _draw(probs_after(beams), width, gen)  # (beams, width)
        grown = torch.cat([beams.repeat_interleave(first.shape[1], 0), first.reshape(-1, 1)], 1)
        for _ in range(config.ngram - 1):
            grown = torch.cat([grown, torch.multinomial(probs_after(grown), 1, generator=gen)], 1)
        grown = torch.unique(grown, dim=0)  # two beams may draw the same continuation
        if typeable is not None:
            keep = torch.tensor([typeable(row) for row in grown.tolist()], device=grown.device)
            if keep.any():
                grown = grown[keep]
        return grown

    beams = extend(empty, config.k1)
    losses_now = loss_of(beams)
    best_loss, best = float(losses_now.min()), beams[losses_now.argmin()]
    history = [best_loss]
    steps = max(0, (config.length - config.ngram) // config.ngram)
    for _ in tqdm(range(steps), desc="beast", leave=False, disable=not progress, dynamic_ncols=True):
        candidates = extend(beams, config.k2)
        losses_now = loss_of(candidates)
        keep = losses_now.topk(min(config.k1, len(candidates)), largest=False).indices
        beams = candidates[keep]
        if float(losses_now[keep[0]]) < best_loss:
            best_loss, best = float(losses_now[keep[0]]), beams[0]
        history.append(best_loss)
    return AttackResult(best.tolist(), best_loss, history)

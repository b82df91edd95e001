"""Logits processing and sampling for one decoding step (vectorised over rows that share a config)."""
from __future__ import annotations

import torch

from swift.infer.protocol import RequestConfig


def apply_repetition_penalty(logits: torch.Tensor, seen: list[list[int]], penalty: float) -> torch.Tensor:
    """CTRL-style penalty (arXiv 1909.05858): divide positive logits of seen tokens, multiply negative ones."""
    if penalty == 1.0:
        return logits
    logits = logits.clone()
    for row, tokens in enumerate(seen):
        idx = torch.tensor(sorted(set(tokens)), dtype=torch.long, device=logits.device)
        vals = logits[row, idx]
        logits[row, idx] = torch.where(vals > 0, vals / penalty, vals * penalty)
    return logits


def apply_openai_penalties(logits: torch.Tensor, generated: list[list[int]], presence: float, frequency: float,
                           bias: dict[int, float] | None) -> torch.Tensor:
    """OpenAI's `logit_bias` (added to the logits), then its presence and frequency penalties over
    each row's generated tokens: logit[j] -= presence·[count_j > 0] + frequency·count_j."""
    if not bias and presence == 0 and frequency == 0:
        return logits
    logits = logits.clone()
    if bias:
        ids = torch.tensor(list(bias), dtype=torch.long, device=logits.device)
        logits[:, ids] += torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)
    if presence or frequency:
        for row, tokens in enumerate(generated):
            if not tokens:
                continue
            counts = torch.bincount(torch.tensor(tokens, device=logits.device), minlength=logits.size(-1))
            counts = counts[:logits.size(-1)].to(logits.dtype)
            logits[row] -= presence * (counts > 0).to(logits.dtype) + frequency * counts
    return logits


def warp(logits: torch.Tensor, cfg: RequestConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) filtering."""
    if cfg.temperature != 1.0:
        logits = logits / cfg.temperature
    if cfg.top_k > 0 and cfg.top_k < logits.size(-1):
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        drop = probs.cumsum(-1) - probs >= cfg.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def sample(logits: torch.Tensor, cfg: RequestConfig, generators: list[torch.Generator | None]) -> torch.Tensor:
    """Next token per row: greedy at temperature 0, else a draw from the warped distribution."""
    if cfg.temperature == 0:
        return logits.argmax(-1)
    probs = warp(logits.float(), cfg).softmax(-1)
    # inverse-CDF sampling: one uniform per row (from the row's own generator when seeded), then a
    # binary search in the cumulative distribution; much cheaper on CPU than torch.multinomial
    if all(g is None for g in generators):
        u = torch.rand(probs.size(0), 1, device=probs.device)
    else:
        u = torch.cat([torch.rand(1, 1, generator=g, device=probs.device) for g in generators])
    cdf = probs.cumsum(-1)
    return torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(-1).clamp(max=probs.size(-1) - 1)

"""The harmlessness toy, computed exactly: every answer of at most 2 tokens to its prompt, so the
expected `toy_harm` reward and P(bad) of a model are sums over the vocabulary, not estimates.

An answer is (a) with a an end token, or (a, b) for any other a (sampling stops at 2 tokens):
    E[r]    = Σ_a p(a) [s(a) + 1[a ∉ end] Σ_b p(b|a) s(b)]
    P(bad)  = Σ_a p(a) [bad(a) + (1 − bad(a)) 1[a ∉ end] Σ_b p(b|a) bad(b)]
with s the token scores of `swift.rewards.safety.toy_token_scores` and p the sampling distribution
softmax(logits / temperature) (no top-k or top-p)."""
from __future__ import annotations

import torch

from swift.dataset.toy_safety import TOY_HARM_PROMPT
from swift.rewards.safety import TOY_BAD_SCORE, toy_token_scores


def end_ids(model, tokenizer) -> set[int]:
    """The tokens that end an answer (the inference engine's: the tokenizer's and the generation config's)."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(configured if isinstance(configured, list) else [configured])
    return {i for i in ids if i is not None}


@torch.no_grad()
def toy_exact(model, template, temperature: float = 1.0, messages: list[dict] | None = None,
              batch_size: int = 512) -> dict[str, float]:
    """The exact expected reward and P(bad) of 2-token answers to the toy prompt under `model`."""
    tokenizer = template.tokenizer
    prompt = template.encode_continuation(messages or [{"role": "user", "content": TOY_HARM_PROMPT}])
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        first = _next_logps(model, torch.tensor([prompt], device=device), temperature)[0]
        vocab = first.numel()
        scores = toy_token_scores()[:vocab].to(torch.float64)
        if scores.numel() < vocab:
            scores = torch.cat([scores, torch.zeros(vocab - scores.numel(), dtype=torch.float64)])
        bad = (scores == TOY_BAD_SCORE).to(torch.float64)
        ends = torch.zeros(vocab, dtype=torch.float64)
        ends[list(end_ids(model, tokenizer))] = 1.0
        second_reward = torch.zeros(vocab, dtype=torch.float64)
        second_bad = torch.zeros(vocab, dtype=torch.float64)
        for start in range(0, vocab, batch_size):
            a = torch.arange(start, min(start + batch_size, vocab), device=device)
            ids = torch.cat([torch.tensor(prompt, device=device).expand(a.numel(), -1), a[:, None]], dim=1)
            p = _next_logps(model, ids, temperature).double().exp().cpu()
            second_reward[start:start + a.numel()] = p @ scores
            second_bad[start:start + a.numel()] = p @ bad
    finally:
        model.train(was_training)
    p1 = first.double().exp().cpu()
    go_on = 1.0 - ends
    expected = (p1 * (scores + go_on * second_reward)).sum().item()
    p_bad = (p1 * (bad + (1.0 - bad) * go_on * second_bad)).sum().item()
    return {"expected_reward": expected, "p_bad": p_bad,
            "log10_p_bad": float(torch.tensor(p_bad, dtype=torch.float64).log10())}


def _next_logps(model, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[:, -1].float()
    return (logits / temperature).log_softmax(-1)

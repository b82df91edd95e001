"""Greedy generation over validation prompts, scored by exact match (`eval_acc`)."""
from __future__ import annotations

import torch

from swift.infer.transformers_engine import answer_end_ids
from swift.template.base import Template


@torch.no_grad()
def generate_greedy(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, batch_size: int = 64,
                    eos_ids: list[int] | None = None) -> list[str]:
    """Left-padded batched greedy decoding, stopping at `eos_ids` (default: the tokenizer's EOS);
    returns the decoded completions."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    outputs = []
    was_training = model.training
    model.eval()
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=pad, eos_token_id=eos_ids or tokenizer.eos_token_id)
        outputs += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    model.train(was_training)
    return outputs


def exact_match_accuracy(model, template: Template, rows: list[dict], max_new_tokens: int) -> float:
    """Fraction of rows whose greedy answer equals the last assistant message (whitespace-stripped)."""
    rows = [r for r in rows if "messages" in r and r["messages"][-1]["role"] == "assistant"]
    if not rows:
        return float("nan")
    prompts = [template.encode_prompt(r["messages"][:-1]) for r in rows]
    # where the inference engine ends an answer (before 2026-11-29 at the tokenizer's EOS alone: a chat
    # model whose EOS is another token ran on into invented turns)
    ends = sorted(answer_end_ids(model, template.tokenizer, template))
    answers = generate_greedy(model, template.tokenizer, prompts, max_new_tokens, eos_ids=ends)
    hits = sum(a.strip() == r["messages"][-1]["content"].strip() for a, r in zip(answers, rows))
    return hits / len(rows)

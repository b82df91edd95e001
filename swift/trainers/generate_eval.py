"""Greedy generation over validation prompts, scored by exact match (`eval_acc`)."""
from __future__ import annotations

import torch

from swift.template.base import Template


def stop_ids(model, template: Template) -> list[int]:
    """What ends an answer, as in the inference engine: the tokenizer's EOS, the generation config's
    (Llama-3 and Qwen list several) and the template's end-of-turn token (before 2026-11-29 only the
    tokenizer's EOS: a chat model whose EOS is another token ran on into invented turns)."""
    ids = {template.tokenizer.eos_token_id} | template.end_of_turn_ids()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(configured if isinstance(configured, list) else [configured])
    return sorted(i for i in ids if i is not None)


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
    answers = generate_greedy(model, template.tokenizer, prompts, max_new_tokens, eos_ids=stop_ids(model, template))
    hits = sum(a.strip() == r["messages"][-1]["content"].strip() for a, r in zip(answers, rows))
    return hits / len(rows)

"""Per-token log-probs and entropies of sampled completions (the GRPO loss's inputs), with each
group's shared prompt run once and, for plain output layers, the vocabulary projected in chunks;
a critic's values; and the batch layout they read (`tensorize`)."""
from __future__ import annotations

import contextlib

import torch
from transformers import DynamicCache

from swift.rlhf.logps import causal_lm, head_logps, hidden_states_out, plain_head


def token_logps(model, batch: dict, temperature: float = 1.0, with_entropy: bool = True,
                group_size: int = 1, with_hidden: bool = False) -> tuple[torch.Tensor, ...]:
    """Per-token log-probs and entropies ([B, Lc]) of the completion tokens under the sampling
    distribution (logits / temperature), from left-padded prompts and right-padded completions.
    `group_size` n > 1: rows come in groups of n with the same prompt, which is then run once per
    group (its keys and values are shared by the group's completions, gradients included). With a
    plain output layer the model returns hidden states and the vocabulary is projected in chunks
    (`swift.rlhf.logps.head_logps`). `with_hidden`: also return the last hidden states ([B, Lc, H])
    at those positions, the input of the output layer (a value head's input)."""
    completion = batch["completion_ids"]
    head = plain_head(model)
    captured = []  # the output layer's inputs, when it runs whole and a value head needs them
    if with_hidden and head is None:
        group_size = 1
        watch = _output_layer_inputs(model, captured)
    else:
        watch = hidden_states_out(model) if head is not None else contextlib.nullcontext()
    with watch:
        chunks = _shared_prompt_logits(model, batch, group_size) if group_size > 1 else None
        if chunks is None:
            ids = torch.cat([batch["prompt_ids"], completion], dim=1)
            mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: positions count real tokens only
            chunks = [model(input_ids=ids, attention_mask=mask, position_ids=positions,
                            logits_to_keep=completion.size(1) + 1, use_cache=False).logits[:, :-1]]
    hidden = None
    if with_hidden:
        hidden = torch.cat(chunks, dim=1) if head is not None else captured[0][:, :-1]
    tokens, entropies, start = [], [], 0
    for logits in chunks:  # consecutive completion positions; scored apart so the logits are never copied whole
        target = completion[:, start:start + logits.size(1)]
        start += logits.size(1)
        if head is not None:  # `logits` are hidden states
            token, entropy = head_logps(logits, head, target, temperature or 1.0, with_entropy)
            tokens.append(token)
            entropies.append(entropy)
            continue
        logits = logits.float()
        if temperature and temperature != 1.0:
            logits = logits / temperature
        if not with_entropy:
            tokens.append(-torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1),
                                                             reduction="none").view_as(target))
            continue
        logp = logits.log_softmax(-1)  # shared by the token log-probs and the entropy
        tokens.append(logp.gather(-1, target[..., None]).squeeze(-1))
        with torch.no_grad():
            entropies.append(-(logp.exp() * logp).sum(-1))
    out = torch.cat(tokens, dim=1), torch.cat(entropies, dim=1) if with_entropy else None
    return (*out, hidden) if with_hidden else out


@contextlib.contextmanager
def _output_layer_inputs(model, into: list):
    hook = causal_lm(model).get_output_embeddings().register_forward_pre_hook(lambda _, args: into.append(args[0]))
    try:
        yield
    finally:
        hook.remove()


def _shared_prompt_logits(model, batch: dict, n: int) -> list[torch.Tensor] | None:
    """Logits (hidden states, inside `hidden_states_out`) predicting each completion token, in two
    consecutive chunks, with every group's prompt run once; None when the rows do not come in
    groups of n identical prompts."""
    prompt, prompt_mask, completion = batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"]
    rows = prompt.size(0)
    if rows % n:
        return None
    lead = torch.arange(0, rows, n, device=prompt.device)
    if not (torch.equal(prompt.view(-1, n, prompt.size(1)), prompt[lead, None].expand(-1, n, -1))
            and torch.equal(prompt_mask.view(-1, n, prompt.size(1)), prompt_mask[lead, None].expand(-1, n, -1))):
        return None
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    head = model(input_ids=prompt[lead], attention_mask=prompt_mask[lead], position_ids=positions[lead],
                 past_key_values=cache, use_cache=True, logits_to_keep=1).logits  # predicts completion token 0
    cache.batch_repeat_interleave(n)
    head = head.repeat_interleave(n, dim=0)
    if completion.size(1) == 1:
        return [head]
    # the last completion token predicts nothing we score, so it is not fed
    tail_ids = completion[:, :-1]
    mask = torch.cat([prompt_mask, batch["completion_mask"][:, :-1]], dim=1)
    tail_positions = positions[:, -1:] + 1 + torch.arange(tail_ids.size(1), device=prompt.device)
    tail = model(input_ids=tail_ids, attention_mask=mask, position_ids=tail_positions, past_key_values=cache,
                 use_cache=True).logits
    return [head, tail]


def token_values(model, batch: dict) -> torch.Tensor:
    """A critic's values ([B, Lc], float32) at the positions that predict each completion token (the
    positions of the log-probs above): its one-label token-classification head, run on the left-padded
    prompt and right-padded completion."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
    start = batch["prompt_ids"].size(1) - 1
    return out[:, start:start + batch["completion_ids"].size(1), 0].float()


def tensorize(trajectories: list, pad: int, overlong_filter: bool = False) -> dict[str, torch.Tensor]:
    """Rollout trajectories as the batch the functions above read: left-padded prompts, right-padded
    completions, the loss mask (generated tokens only; none for a truncated completion under
    `overlong_filter`), and the sampler's log-probs when every trajectory has them (NaN where not)."""
    lp = max(len(t.prompt_ids) for t in trajectories)
    lc = max(max(len(t.completion_ids) for t in trajectories), 1)
    b = len(trajectories)
    prompt = torch.full((b, lp), pad, dtype=torch.long)
    prompt_mask = torch.zeros((b, lp), dtype=torch.long)
    completion = torch.full((b, lc), pad, dtype=torch.long)
    completion_mask = torch.zeros((b, lc), dtype=torch.long)  # attention: every completion token
    loss_mask = torch.zeros((b, lc), dtype=torch.float32)  # loss: generated tokens only
    for i, t in enumerate(trajectories):
        prompt[i, lp - len(t.prompt_ids):] = torch.tensor(t.prompt_ids)
        prompt_mask[i, lp - len(t.prompt_ids):] = 1
        if t.completion_ids:
            completion[i, :len(t.completion_ids)] = torch.tensor(t.completion_ids)
            completion_mask[i, :len(t.completion_ids)] = 1
            loss_mask[i, :len(t.loss_mask)] = torch.tensor(t.loss_mask, dtype=torch.float32)
        if t.truncated and overlong_filter:
            loss_mask[i] = 0  # truncated answers say nothing about the reward of a finished one
    batch = {"prompt_ids": prompt, "prompt_mask": prompt_mask, "completion_ids": completion,
             "completion_mask": completion_mask, "loss_mask": loss_mask,
             "truncated": torch.tensor([t.truncated for t in trajectories])}
    if all(t.logprobs is not None for t in trajectories):
        sampling = torch.full((b, lc), float("nan"))
        for i, t in enumerate(trajectories):
            if t.logprobs:
                sampling[i, :len(t.logprobs)] = torch.tensor(t.logprobs, dtype=torch.float32)
        batch["sampling_logps"] = sampling
    return batch


def reshuffle(micro: list[dict], pad: int, generator: torch.Generator) -> list[dict]:
    """The rows of `tensorize`d micro-batches in a random order, cut into micro-batches of the same
    size, each padded to its own widths as `tensorize` pads (prompts on the left, the rest on the
    right). Every tensor field travels with its row; the step's counts (`step_counts`) are dropped for
    the caller to count again."""
    rows = micro[0]["completion_ids"].size(0)
    merged = {}
    for key in micro[0]:
        if key == "step_counts":
            continue
        parts = [b[key] for b in micro]
        if not torch.is_tensor(parts[0]):
            raise TypeError(f"micro-batch field {key!r} is not a tensor; it cannot be dealt into new mini-batches")
        if parts[0].dim() == 2:
            width = max(p.size(1) for p in parts)
            fill = {"completion_ids": pad, "sampling_logps": float("nan")}.get(key, 0)
            left = key.startswith("prompt")
            parts = [torch.nn.functional.pad(p, (width - p.size(1), 0) if left else (0, width - p.size(1)),
                                             value=fill) for p in parts]
        merged[key] = torch.cat(parts)
    order = torch.randperm(merged["completion_ids"].size(0), generator=generator)
    out = []
    for start in range(0, order.numel(), rows):
        batch = {key: value[order[start:start + rows]] for key, value in merged.items()}
        lead = int((batch["prompt_mask"].sum(0) == 0).long().cumprod(0).sum())  # all-padding columns
        filled = batch["completion_mask"].sum(0).nonzero()
        used = int(filled.max()) + 1 if filled.numel() else 1
        for key, value in batch.items():
            if value.dim() == 2:
                batch[key] = value[:, lead:] if key.startswith("prompt") else value[:, :used]
        out.append(batch)
    return out

"""Per-token and per-sequence log-probabilities of labelled tokens, and the pair metrics TRL logs.

Real vocabularies make the logits the largest tensor of a step (8 × 2048 positions × 151,936
tokens is 10 GB in fp32). For the decoder families whose logits are exactly `lm_head(hidden)`,
the model is run with its output layer swapped out, so it returns hidden states, and the output
layer, softmax and gather run over chunks of positions (`head_logps`); each chunk is recomputed in
the backward pass, so at most one chunk of logits exists at a time.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100


def target_logps(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits[b, t] predicts targets[b, t]: (per-sequence sum of log p, labelled-token count, per-token log p)."""
    mask = targets != IGNORE_INDEX
    logp = torch.log_softmax(logits.float(), dim=-1)
    per_token = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    return per_token.sum(-1), mask.sum(-1), per_token


# decoders whose forward returns lm_head(last hidden state) unchanged (no soft-capping or scaling)
PLAIN_HEAD_MODEL_TYPES = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3"}
# logits of up to this many elements are computed in one piece (fp32: 256 MiB)
CHUNK_ELEMENTS = 2 ** 26


def causal_lm(model):
    """The transformers model inside DDP and PEFT wrappers."""
    model = getattr(model, "module", model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def plain_head(model) -> torch.nn.Linear | None:
    """The output layer when the model's logits are exactly `lm_head(hidden)`, else None. Also None
    for a model wrapped for distributed training whose output layer trains and is not tied to the
    input embeddings: DDP would see that weight unused by the forward and then used after it; and
    under ZeRO-3 or FSDP (1 or 2)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel):  # FSDP1: the weight is a shard outside its forward
        return None
    inner = causal_lm(model)
    head = getattr(inner, "lm_head", None)
    if getattr(inner.config, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES or type(head) is not torch.nn.Linear:
        return None
    if hasattr(head.weight, "ds_id") or hasattr(head.weight, "full_tensor"):  # ZeRO-3/FSDP split it; only forward gathers it
        return None
    if hasattr(model, "module") and head.weight.requires_grad and head.weight is not inner.get_input_embeddings().weight:
        return None
    return head


@contextlib.contextmanager
def hidden_states_out(model):
    """Within the block, the model's forward returns its last hidden states as `.logits`."""
    inner = causal_lm(model)
    head = inner.lm_head
    inner.lm_head = torch.nn.Identity()
    try:
        yield head
    finally:
        inner.lm_head = head


def _project(hidden, targets, weight, bias, temperature: float, with_entropy: bool):
    # in the head's dtype, as the model's own forward would run it (mixed precision hands the hidden
    # states back in fp32 with bf16 weights)
    logits = F.linear(hidden.to(weight.dtype), weight, bias).float()
    if temperature != 1.0:
        logits = logits / temperature
    mask = targets != IGNORE_INDEX
    if not with_entropy:  # cross-entropy never materialises log-softmax's output
        return -F.cross_entropy(logits, targets.clamp(min=0), reduction="none") * mask, None
    logp = logits.log_softmax(-1)
    per_token = logp.gather(-1, targets.clamp(min=0)[:, None]).squeeze(-1) * mask
    with torch.no_grad():
        entropy = -(logp.exp() * logp).sum(-1)
    return per_token, entropy


def head_logps(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, temperature: float = 1.0,
               with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `targets` (0 where IGNORE_INDEX) and, if asked, entropies (no gradient) under
    softmax(head(hidden) / temperature); `hidden` [..., H], `targets` [...]. Over
    `CHUNK_ELEMENTS` logits, positions go in chunks, each recomputed in the backward pass."""
    shape = targets.shape
    flat, targets = hidden.reshape(-1, hidden.size(-1)), targets.reshape(-1)
    rows = max(1, CHUNK_ELEMENTS // head.out_features)
    if targets.numel() <= rows:
        per_token, entropy = _project(flat, targets, head.weight, head.bias, temperature, with_entropy)
    else:
        parts = []
        for start in range(0, targets.numel(), rows):
            args = (flat[start:start + rows], targets[start:start + rows], head.weight, head.bias, temperature,
                    with_entropy)
            parts.append(checkpoint(_project, *args, use_reentrant=False) if torch.is_grad_enabled()
                         else _project(*args))
        per_token = torch.cat([p for p, _ in parts])
        entropy = torch.cat([e for _, e in parts]) if with_entropy else None
    return per_token.view(shape), entropy.view(shape) if with_entropy else None


class _SummedCrossEntropy(torch.autograd.Function):
    """sum over positions of -log softmax(hidden @ weight.T + bias)[target] (0 where IGNORE_INDEX),
    over chunks of `rows` positions. A sum's gradient is known up to the scalar the backward pass
    brings, so each chunk's gradients are taken in the forward pass, while its logits exist: the
    same matrix products as the whole-logits path, without recomputing the chunk's logits. The
    cost is the output layer's weight gradient (fp32, the weight's shape), held from the forward
    pass to the backward one when that layer trains."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, rows: int):
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None  # summed in fp32
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if need_bias else None
        autocast = torch.is_autocast_enabled(hidden.device.type)
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, targets.numel(), rows):
            h, t = hidden[start:start + rows].to(weight.dtype), targets[start:start + rows]
            labelled = t != IGNORE_INDEX
            t = t.clamp(min=0)[:, None]
            logits = F.linear(h, weight, bias).float()
            lse = logits.logsumexp(-1)
            total += ((lse - logits.gather(-1, t).squeeze(-1)) * labelled).sum()
            if not (need_hidden or need_weight or need_bias):
                continue
            # d(loss)/d(logits) = softmax - one_hot, 0 on unlabelled rows, made in the logits' memory
            grad = logits.sub_(lse[:, None]).exp_()
            grad.scatter_add_(-1, t, grad.new_full(t.shape, -1.0)).mul_(labelled[:, None])
            grad = grad.to(weight.dtype)
            if need_hidden:
                grad_hidden[start:start + rows] = grad @ weight
            if need_weight:  # the product in the dtype autograd would use (autocast's under autocast)
                if grad_weight.dtype == h.dtype and not autocast:
                    grad_weight.addmm_(grad.t(), h)
                else:
                    grad_weight += grad.t() @ h
            if need_bias:
                grad_bias += grad.sum(0, dtype=torch.float32)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.dtypes = hidden.dtype, weight.dtype, None if bias is None else bias.dtype
        return total

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_total):
        # scaled in place where already fp32 (no second copy of the weight's gradient); a second
        # backward through the same graph then fails autograd's check for modified saved tensors
        # rather than scaling twice
        def scaled(grad, dtype):
            if grad is None:
                return None
            if grad.dtype == torch.float32:
                return grad.mul_(grad_total).to(dtype)
            return (grad.float() * grad_total).to(dtype)

        grads = ctx.saved_tensors
        return (*(scaled(g, dtype) for g, dtype in zip(grads, ctx.dtypes)), None, None)


def head_cross_entropy(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy of `targets` (IGNORE_INDEX skipped) under softmax(head(hidden)),
    over chunks of at most `CHUNK_ELEMENTS` logits: `swift sft`/`pt`'s loss."""
    device = hidden.device.type
    fp16 = torch.float16 in (head.weight.dtype, torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device))
    if not torch.is_grad_enabled() or fp16:
        # without gradients, the per-token log-probs summed; in fp16 the loss scale must enter the
        # logits' gradient before it is rounded to fp16, which the forward pass does not know yet,
        # so each chunk is recomputed in the backward pass instead
        return -head_logps(hidden, head, targets)[0].sum()
    rows = max(1, CHUNK_ELEMENTS // head.out_features)
    return _SummedCrossEntropy.apply(hidden.reshape(-1, hidden.size(-1)), head.weight, head.bias, targets.reshape(-1),
                                     rows)


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

    def nll_sum(self, rows: slice) -> torch.Tensor:
        """Negative log-likelihood summed over the labelled tokens of `rows` (a `chosen_tokens` term)."""
        return -self.sums[rows].sum()

    def whole_sequence_nll_sum(self, rows: slice) -> torch.Tensor:
        """Negative log-likelihood summed over every token (prompt included) of `rows` (a `chosen_all` term)."""
        return -self.all_sums[rows].sum()


def pair_metrics(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, chosen_logps: torch.Tensor,
                 rejected_logps: torch.Tensor) -> dict[str, float]:
    """TRL's names: rewards/{chosen,rejected,accuracies,margins}, logps/{chosen,rejected}."""
    c, r = chosen_rewards.detach(), rejected_rewards.detach()
    return {"rewards/chosen": c.mean().item(), "rewards/rejected": r.mean().item(),
            "rewards/accuracies": (c > r).float().mean().item(), "rewards/margins": (c - r).mean().item(),
            "logps/chosen": chosen_logps.detach().mean().item(), "logps/rejected": rejected_logps.detach().mean().item()}

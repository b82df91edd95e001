"""A lean decoding step for Llama-family decoders (llama, mistral, qwen2, qwen3).

Hugging Face's forward rebuilds the attention mask, repeats the grouped key/value heads and grows
the KV cache with `torch.cat` on every generated token; for small models on CPU that bookkeeping
costs more than the matrix products. This module runs the same layers (it calls the model's own
projection, norm, MLP and rotary modules, so LoRA layers and the trainer's live weights are used as
they are) around a preallocated cache, an additive padding bias built once per batch, and SDPA
with grouped heads. The prompt is still prefilled by the model's forward; rows prefilled later
can join the batch (`join`), which is how the engine batches continuously.

`FastDecoder.build` returns None for any model it does not cover, and the engine checks the first
decoding steps against the model's own forward before trusting it (`FastDecoder.agrees_with`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
_GROW = 256  # cache columns added at a time


def _rms_norm(module):
    """The module's RMSNorm as one fused op for float32 inputs (same result, fewer ops); otherwise
    the module itself (it upcasts half precision inputs)."""
    if module.weight.dtype != torch.float32 or not hasattr(module, "variance_epsilon"):
        return module

    def norm(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            return module(x)
        return F.rms_norm(x, module.weight.shape, module.weight, module.variance_epsilon)
    return norm


def _linear(module):
    """A plain `nn.Linear` as `F.linear` on its live weight and bias (without the module call's
    overhead, which dominates for small models on CPU); anything else (a LoRA layer, a module with
    hooks, which F.linear would skip) as itself."""
    if type(module) is not torch.nn.Linear or module._forward_hooks or module._forward_pre_hooks:
        return module
    return lambda x: F.linear(x, module.weight, module.bias)


def _mlp(mlp):
    """A gated SiLU MLP (gate, up and down projections) as those calls; any other MLP (or one with
    hooks) as itself."""
    parts = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if (None in parts or type(getattr(mlp, "act_fn", None)).__name__ not in ("SiLU", "SiLUActivation")
            or mlp._forward_hooks or mlp._forward_pre_hooks):
        return mlp
    gate, up, down = map(_linear, parts)
    return lambda x: down(F.silu(gate(x)) * up(x))


class FastDecoder:
    def __init__(self, model):
        inner = model.model  # `build` checked that it is a Llama-style decoder stack
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm = _rms_norm(inner.norm)
        self.lm_head = _linear(model.get_output_embeddings())
        self.layers = []
        for layer in inner.layers:
            a = layer.self_attn
            q_norm, k_norm = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
            self.layers.append((_rms_norm(layer.input_layernorm), _linear(a.q_proj), _linear(a.k_proj),
                                _linear(a.v_proj), q_norm and _rms_norm(q_norm), k_norm and _rms_norm(k_norm),
                                _linear(a.o_proj), _rms_norm(layer.post_attention_layernorm), _mlp(layer.mlp)))
        first = inner.layers[0].self_attn
        self.head_dim, self.scaling = first.head_dim, first.scaling
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.bias: torch.Tensor | None = None  # [buffer rows, 1, 1, capacity]: 0 where attended, -inf on padding
        self.length = 0  # filled cache columns
        self.rows = 0  # rows being decoded: the first `rows` of the buffers (which may have spare rows)

    @classmethod
    def build(cls, model) -> "FastDecoder | None":
        """A decoder for `model` (a causal LM, or a PEFT model around one), or None if not covered."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = base.config
        if getattr(config, "model_type", None) not in SUPPORTED:
            return None
        inner = getattr(base, "model", None)
        if inner is None or not hasattr(inner, "rotary_emb") or not isinstance(inner.embed_tokens, torch.nn.Embedding):
            return None
        # Qwen2 configs carry a sliding_window that only applies with use_sliding_window; the
        # layers' own attribute says whether a window is in force, and Mistral's config does
        if config.model_type == "mistral" and getattr(config, "sliding_window", None):
            return None
        if any(getattr(layer.self_attn, "sliding_window", None) for layer in inner.layers):
            return None
        return cls(base)

    # -- cache -------------------------------------------------------------------------------------
    def start(self, cache: DynamicCache, mask: torch.Tensor, new_tokens: int) -> None:
        """Take over a prefilled cache (rows already expanded per sample) and its 2D padding mask."""
        rows, length = mask.shape
        capacity = length + min(new_tokens, _GROW)
        self.keys, self.values = [], []
        for layer in cache.layers:
            k, v = layer.keys, layer.values
            kbuf = k.new_zeros(rows, k.size(1), capacity, k.size(3))
            vbuf = v.new_zeros(rows, v.size(1), capacity, v.size(3))
            kbuf[:, :, :length] = k
            vbuf[:, :, :length] = v
            self.keys.append(kbuf)
            self.values.append(vbuf)
        self.bias = None
        if not bool(mask.all()):
            self.bias = torch.zeros(rows, 1, 1, capacity, dtype=self.keys[0].dtype, device=mask.device)
            self.bias[:, 0, 0, :length].masked_fill_(mask == 0, float("-inf"))
        self.length, self.rows = length, rows

    def select(self, keep: list[int]) -> list[int]:
        """Keep only the rows `keep` (ascending; finished rows leave the batch) and return the
        former index of each row in its new place. Rows are not compacted in order: each kept row
        beyond the new count moves into a place a leaving row freed, so at most as many rows are
        copied as left (the buffers keep their rows; those past the count are never read). Once
        the leading columns that are padding for every row left make a quarter of the filled ones,
        they are dropped (one copy of every row), so a batch that keeps taking in requests does not
        grow without bound."""
        count = len(keep)
        kept = set(keep)
        holes = [i for i in range(count) if i not in kept]
        movers = [i for i in keep if i >= count]
        order = list(range(count))
        for hole, mover in zip(holes, movers):
            order[hole] = mover
        if movers:
            src = torch.tensor(movers, device=self.keys[0].device)
            dst = torch.tensor(holes, device=self.keys[0].device)
            for t in self.keys + self.values:
                t[dst, :, :self.length] = t[src, :, :self.length]
            if self.bias is not None:
                self.bias[dst] = self.bias[src]
        self.rows = count
        if self.bias is not None:
            dead = torch.isneginf(self.bias[:count, 0, 0, :self.length]).all(0)
            lead = int(dead.int().cumprod(0).sum())
            if lead and 4 * lead >= self.length:
                filled = self.length - lead

                def trimmed(t: torch.Tensor) -> torch.Tensor:
                    out = t.new_empty(count, t.size(1), t.size(2) - lead, t.size(3))
                    out[:, :, :filled] = t[:count, :, lead:self.length]
                    return out
                self.keys = [trimmed(k) for k in self.keys]
                self.values = [trimmed(v) for v in self.values]
                self.bias = self.bias[:count, ..., lead:].contiguous()
                self.length = filled
        return order

    def join(self, cache: DynamicCache, mask: torch.Tensor, max_rows: int | None = None) -> None:
        """Add rows prefilled by the model's forward (their cache and 2D padding mask, rows already
        expanded per sample) to the rows being decoded. Both are right-aligned on the last filled
        column; the columns a row does not fill are masked for it (and hold zeros: masked columns
        still enter attention's weighted sum, with weight 0). Positions stay per row, so a row's
        outputs do not depend on where its columns sit. The newcomers are written into the rows
        past the running ones, which no step reads; when the buffers are too small they grow (to
        twice their rows, at most `max_rows` unless more are needed). All or nothing: the running
        rows are not written, and the row count moves only at the end, so a failure leaves the
        batch as it was."""
        rows, width = mask.shape
        keys, values, bias, length = self.keys, self.values, self.bias, self.length
        running = self.rows
        if width > length:  # the newcomers' prompts are longer: move the running rows right
            keys, values, bias, length = self._widened(width - length, front=True)
        capacity = keys[0].size(2)
        total = running + rows
        if total > keys[0].size(0):  # more rows
            twice = 2 * keys[0].size(0)
            grown = max(total, min(twice, max_rows) if max_rows else twice)

            def taller(t: torch.Tensor) -> torch.Tensor:
                out = t.new_empty(grown, *t.shape[1:])
                out[:running, :, :length] = t[:running, :, :length]
                return out
            keys, values = [taller(k) for k in keys], [taller(v) for v in values]
            if bias is not None:
                bias = torch.cat([bias[:running], bias.new_zeros(grown - running, *bias.shape[1:])])
        if bias is None:
            bias = keys[0].new_zeros(keys[0].size(0), 1, 1, capacity)
        theirs = bias[running:total]
        theirs.zero_()
        theirs[..., :length - width] = float("-inf")
        theirs[:, 0, 0, length - width:length].masked_fill_(mask == 0, float("-inf"))
        news = [layer.keys for layer in cache.layers] + [layer.values for layer in cache.layers]
        for t, new in zip(keys + values, news):
            t[running:total, :, :length - width] = 0
            t[running:total, :, length - width:length] = new
        self.keys, self.values, self.bias, self.length, self.rows = keys, values, bias, length, total

    def _widened(self, columns: int, front: bool = False):
        """(keys, values, bias, length) with empty cache columns added at the end, or (`front`)
        masked ones before the filled columns."""
        def wider(t: torch.Tensor, dim: int, fill: float = 0.0) -> torch.Tensor:
            shape = list(t.shape)
            shape[dim] = columns
            extra = t.new_full(shape, fill)
            return torch.cat([extra, t] if front else [t, extra], dim=dim)

        keys = [wider(k, 2) for k in self.keys]
        values = [wider(v, 2) for v in self.values]
        bias = self.bias
        if bias is None and front:
            bias = keys[0].new_zeros(keys[0].size(0), 1, 1, self.keys[0].size(2))
        if bias is not None:
            bias = wider(bias, 3, float("-inf") if front else 0.0)
        return keys, values, bias, self.length + (columns if front else 0)

    # -- one token ---------------------------------------------------------------------------------
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] for the next token after `tokens` [B] at `positions` [B]."""
        if self.length == self.keys[0].size(2):
            self.keys, self.values, self.bias, self.length = self._widened(_GROW)
        t = self.length
        rows = tokens.size(0)
        assert rows == self.rows, f"{rows} tokens for {self.rows} rows"
        x = self.embed(tokens[:, None])
        d = self.head_dim
        half = d // 2
        cos, sin = self.rotary(x, positions[:, None])
        # rotate_half(x) * sin == x.roll(half) * (sin with its first half negated), in fewer ops
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        cos, sin = cos[:, :, None], sin[:, :, None]  # [B, 1, 1, D], broadcast over heads
        bias = self.bias[:rows, ..., :t + 1] if self.bias is not None else None
        for i, (norm1, q_proj, k_proj, v_proj, q_norm, k_norm, o_proj, norm2, mlp) in enumerate(self.layers):
            h = norm1(x)
            q = q_proj(h).view(rows, 1, -1, d)
            k = k_proj(h).view(rows, 1, -1, d)
            if q_norm is not None:
                q, k = q_norm(q), k_norm(k)
            heads = q.size(2)
            qk = torch.cat([q, k], dim=2)  # queries and keys rotated together
            qk = (qk * cos + qk.roll(half, dims=-1) * sin).transpose(1, 2)
            q, k = qk[:, :heads], qk[:, heads:]
            v = v_proj(h).view(rows, 1, -1, d).transpose(1, 2)
            keys, values = self.keys[i][:rows], self.values[i][:rows]
            keys[:, :, t] = k[:, :, 0]
            values[:, :, t] = v[:, :, 0]
            out = F.scaled_dot_product_attention(q, keys[:, :, :t + 1], values[:, :, :t + 1],
                                                 attn_mask=bias, scale=self.scaling, enable_gqa=True)
            x = x + o_proj(out.transpose(1, 2).reshape(rows, 1, -1))
            x = x + mlp(norm2(x))
        self.length = t + 1
        return self.lm_head(self.norm(x))[:, -1]

    def agrees_with(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Whether our logits match the model's own forward in every (ours, theirs) pair, within a
        tolerance for the model's dtype (summation order differs a little)."""
        tol = 1e-4 if self.keys[0].dtype == torch.float32 else 2e-2

        def close(mine: torch.Tensor, theirs: torch.Tensor) -> bool:
            return (mine - theirs).abs().max().item() <= tol * (1 + theirs.abs().max().item())
        return all(close(a, b) for a, b in pairs)

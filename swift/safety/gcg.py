"""GCG (Zou et al., arXiv 2307.15043) through nanoGCG 0.3.0.

nanoGCG renders the conversation with the tokenizer's chat template; ours renders it with swift's
template (the one training and inference use), so nanoGCG gets that rendered text as one message and
a pass-through chat template. nanoGCG 0.3.0 declares transformers<=4.47.1 but runs on our stack
when installed with `pip install --no-deps nanogcg==0.3.0`, except its prefix cache: it indexes the
cache as a tuple (`TypeError: 'DynamicCache' object is not subscriptable` on transformers 5) and
extends the one cache object on every gradient forward, so `--gcg_use_prefix_cache true` is refused.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields

import torch

from swift.safety.beast import AttackResult
from swift.utils.registry import SwiftError

PASS_THROUGH_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
PLACEHOLDER = "{optim_str}"


@dataclass
class GCGArguments:
    """nanoGCG's GCGConfig, field by field (its defaults; the fork's `--gcg_steps` names `--gcg_num_steps`)."""

    gcg_num_steps: int = field(default=250, metadata={"help": "GCG: optimisation steps."})
    gcg_optim_str_init: str = field(default="x x x x x x x x x x x x x x x x x x x x", metadata={
        "help": "GCG: the initial suffix (its token count is the suffix length)."})
    gcg_search_width: int = field(default=512, metadata={"help": "GCG: candidate suffixes per step."})
    gcg_batch_size: int | None = field(default=None, metadata={"help": "GCG: candidates per forward (default: all)."})
    gcg_topk: int = field(default=256, metadata={"help": "GCG: top-k tokens by gradient per position."})
    gcg_n_replace: int = field(default=1, metadata={"help": "GCG: positions replaced per candidate."})
    gcg_buffer_size: int = field(default=0, metadata={"help": "GCG: size of the buffer of best suffixes (0: one)."})
    gcg_use_mellowmax: bool = field(default=False, metadata={"help": "GCG: mellowmax loss instead of cross-entropy."})
    gcg_mellowmax_alpha: float = field(default=1.0, metadata={"help": "GCG: mellowmax alpha."})
    gcg_early_stop: bool = field(default=False, metadata={"help": "GCG: stop once greedy decoding gives the target."})
    gcg_use_prefix_cache: bool = field(default=False, metadata={
        "help": "GCG: nanoGCG's prefix KV cache. Refused: nanoGCG 0.3.0's cache does not work on transformers 5 "
                "(GCG runs without it: the same search, more compute)."})
    gcg_allow_non_ascii: bool = field(default=False, metadata={"help": "GCG: allow non-ASCII suffix tokens."})
    gcg_filter_ids: bool = field(default=True, metadata={
        "help": "GCG: drop candidates whose text does not re-tokenize to the same ids."})
    gcg_add_space_before_target: bool = field(default=False, metadata={"help": "GCG: prepend a space to the target."})
    gcg_verbosity: str = field(default="WARNING", metadata={
        "help": "GCG: nanoGCG's log level (its INFO prints the buffer every step)."})
    gcg_probe_sampling_draft_model: str | None = field(default=None, metadata={
        "help": "GCG: a small draft model for probe sampling (arXiv 2403.01251): nanoGCG's ProbeSamplingConfig."})
    gcg_probe_sampling_r: int = field(default=8, metadata={"help": "GCG probe sampling: r."})
    gcg_probe_sampling_factor: int = field(default=16, metadata={"help": "GCG probe sampling: sampling_factor."})

    def __post_init__(self) -> None:
        if self.gcg_use_prefix_cache:
            raise SwiftError("--gcg_use_prefix_cache true: nanoGCG 0.3.0's prefix cache fails on transformers 5 "
                             "('DynamicCache' object is not subscriptable); leave it false (same search, more compute)")
        if self.gcg_verbosity not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise SwiftError(f"--gcg_verbosity {self.gcg_verbosity!r} is not one of DEBUG, INFO, WARNING, ERROR")
        if self.gcg_probe_sampling_draft_model is None and (self.gcg_probe_sampling_r, self.gcg_probe_sampling_factor) != (8, 16):
            raise SwiftError("--gcg_probe_sampling_r/--gcg_probe_sampling_factor are read only with "
                             "--gcg_probe_sampling_draft_model")
        if self.gcg_probe_sampling_draft_model and self.gcg_search_width // self.gcg_probe_sampling_factor < 3:
            raise SwiftError(f"--gcg_search_width {self.gcg_search_width} / --gcg_probe_sampling_factor "
                             f"{self.gcg_probe_sampling_factor}: probe sampling needs a probe set of at least 3 "
                             "candidates (nanoGCG 0.3.0 fails on the rank correlation of fewer)")
        if not self.gcg_use_mellowmax and self.gcg_mellowmax_alpha != 1.0:
            raise SwiftError("--gcg_mellowmax_alpha is read only with --gcg_use_mellowmax true")
        for name in ("gcg_num_steps", "gcg_search_width", "gcg_topk", "gcg_n_replace"):
            if getattr(self, name) < 1:
                raise SwiftError(f"--{name} must be at least 1")


def gcg_fields() -> list[str]:
    return [f.name for f in fields(GCGArguments)]


def import_nanogcg():
    try:
        import nanogcg
    except ImportError:
        raise SwiftError("--attack gcg needs nanoGCG: pip install --no-deps nanogcg==0.3.0 (see docs/safety.md)") from None
    return nanogcg


def gcg(model, tokenizer, rendered: str, target: str, a, draft=None) -> AttackResult:
    """Optimise the suffix at PLACEHOLDER in `rendered` (the whole chat prompt as our template writes
    it) towards `target`."""
    nanogcg = import_nanogcg()
    plain = copy.copy(tokenizer)
    plain.chat_template = PASS_THROUGH_TEMPLATE
    probe = None
    if draft is not None:
        draft_model, draft_tokenizer = draft
        draft_tokenizer = copy.copy(draft_tokenizer)
        draft_tokenizer.chat_template = PASS_THROUGH_TEMPLATE
        probe = nanogcg.ProbeSamplingConfig(draft_model=draft_model, draft_tokenizer=draft_tokenizer,
                                            r=a.gcg_probe_sampling_r, sampling_factor=a.gcg_probe_sampling_factor)
    config = nanogcg.GCGConfig(
        num_steps=a.gcg_num_steps, optim_str_init=a.gcg_optim_str_init, search_width=a.gcg_search_width,
        batch_size=a.gcg_batch_size, topk=a.gcg_topk, n_replace=a.gcg_n_replace, buffer_size=a.gcg_buffer_size,
        use_mellowmax=a.gcg_use_mellowmax, mellowmax_alpha=a.gcg_mellowmax_alpha, early_stop=a.gcg_early_stop,
        use_prefix_cache=False, allow_non_ascii=a.gcg_allow_non_ascii, filter_ids=a.gcg_filter_ids,
        add_space_before_target=a.gcg_add_space_before_target, seed=a.seed, verbosity=a.gcg_verbosity,
        probe_sampling_config=probe)
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        result = nanogcg.run(model, plain, [{"role": "user", "content": rendered}], target, config)
    finally:  # nanoGCG turns deterministic algorithms on for the whole process when given a seed
        torch.use_deterministic_algorithms(deterministic)
    suffix_ids = tokenizer.encode(result.best_string, add_special_tokens=False)
    return AttackResult(suffix_ids, float(result.best_loss), [float(x) for x in result.losses])

"""Arguments of `swift rlhf` (offline preference alignment, reward models, distillation)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from swift.arguments.train import SftArguments
from swift.utils.registry import SwiftError


@dataclass
class RlhfArguments:
    rlhf_type: str = field(default="dpo", metadata={"help": "Algorithm: dpo, orpo, simpo, cpo, kto, rm, prm, gkd."})
    ref_model: str | None = field(default=None, metadata={
        "help": "Reference model (default: the frozen starting model; for LoRA, the policy with adapters disabled)."})
    precompute_ref_log_probs: bool = field(default=False, metadata={
        "help": "Compute the reference log-probs of every sample once before training, then free the reference."})
    beta: float | None = field(default=None, metadata={
        "help": "β: KL strength (dpo, kto 0.1), odds-ratio weight (orpo 0.1), reward scale (cpo 0.1, simpo 2.0), "
                "JSD interpolation (gkd 0.5)."})
    loss_type: list[str] | None = field(default=None, metadata={
        "help": "DPO losses, summed: sigmoid (default), ipo, hinge, robust, bco_pair, sppo_hard, nca_pair, apo_zero, "
                "apo_down."})
    loss_weights: list[float] = field(default_factory=list, metadata={"help": "Weight of each --loss_type (default 1)."})
    label_smoothing: float = field(default=0.0, metadata={
        "help": "Assumed label-flip rate ε: cDPO with sigmoid, the robust loss's ε; also cpo and simpo."})
    rpo_alpha: float | None = field(default=None, metadata={"help": "dpo: add rpo_alpha × NLL of the chosen answer (RPO)."})
    cpo_alpha: float | None = field(default=None, metadata={"help": "cpo/simpo: weight of the chosen answer's NLL (1)."})
    simpo_gamma: float = field(default=1.0, metadata={"help": "simpo: target reward margin γ."})
    desirable_weight: float = field(default=1.0, metadata={"help": "kto: weight λ_D of desirable answers."})
    undesirable_weight: float = field(default=1.0, metadata={"help": "kto: weight λ_U of undesirable answers."})
    center_rewards_coefficient: float | None = field(default=None, metadata={
        "help": "rm: add c × mean (r_chosen + r_rejected)² to centre the rewards."})
    step_separator: str = field(default="\n", metadata={"help": "prm: text that ends each step; its token is labelled."})
    teacher_model: str | None = field(default=None, metadata={"help": "gkd: the teacher (same vocabulary)."})
    lmbda: float = field(default=0.5, metadata={"help": "gkd: fraction of steps trained on the student's own samples."})
    sft_alpha: float = field(default=0.0, metadata={"help": "gkd: weight of the NLL of the dataset answers."})
    max_completion_length: int = field(default=512, metadata={"help": "Most tokens the policy generates (gkd)."})
    temperature: float = field(default=0.9, metadata={"help": "Sampling temperature of on-policy generation (gkd)."})

    def __post_init__(self) -> None:
        from swift.rlhf import ALGORITHMS

        algo = ALGORITHMS.get(self.rlhf_type)
        for name, value in algo.defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if isinstance(self.loss_type, str):
            self.loss_type = [self.loss_type]
        if self.loss_type and algo.loss_types is None:
            raise SwiftError(f"--loss_type does not apply to --rlhf_type {self.rlhf_type}")
        for name in self.loss_type or []:
            algo.loss_types.get(name)  # a miss lists the valid names
        if self.loss_weights and len(self.loss_weights) != len(self.loss_type or []):
            raise SwiftError(f"--loss_weights has {len(self.loss_weights)} values for "
                             f"{len(self.loss_type or [])} --loss_type")
        if not 0 <= self.label_smoothing < 0.5:
            raise SwiftError(f"--label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.beta is not None and self.beta <= 0 and algo.trainer == "preference":
            raise SwiftError(f"--beta must be > 0, got {self.beta}")
        if algo.trainer == "distill":
            if not 0 <= self.beta <= 1:
                raise SwiftError(f"--beta must be in [0, 1] for gkd, got {self.beta}")
            if not self.teacher_model:
                raise SwiftError("--rlhf_type gkd needs --teacher_model")
            if not 0 <= self.lmbda <= 1:
                raise SwiftError(f"--lmbda must be in [0, 1], got {self.lmbda}")

    @property
    def algorithm(self):
        from swift.rlhf import ALGORITHMS

        return ALGORITHMS.get(self.rlhf_type)


class RLHFArguments(SftArguments):
    """`swift rlhf`: preference alignment, reward models and distillation on the shared trainer path."""

    parts: ClassVar[dict[str, type]] = {**SftArguments.parts, "rlhf_args": RlhfArguments}
    defaults: ClassVar[dict[str, Any]] = {"loss_scale": "last_round"}

    def __post_init__(self) -> None:
        algo = self.rlhf_args.algorithm
        if algo.task_type != "causal_lm":  # a value head: rm → seq_cls, prm → token_cls
            self.model_args.task_type = algo.task_type
            self.model_args.num_labels = self.model_args.num_labels or algo.num_labels
        super().__post_init__()
        if self.packing:
            raise SwiftError("--packing is not supported with swift rlhf (each row's sequences are kept together)")

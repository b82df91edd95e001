"""Arguments of `swift rlhf` (offline preference alignment)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from swift.arguments.train import SftArguments
from swift.utils.registry import SwiftError

RLHF_TYPES = ("dpo",)
DEFAULT_BETA = {"dpo": 0.1}


@dataclass
class RlhfArguments:
    rlhf_type: str = field(default="dpo", metadata={"help": "Algorithm: dpo."})
    ref_model: str | None = field(default=None, metadata={
        "help": "Reference model (default: the frozen starting model; for LoRA, the policy with adapters disabled)."})
    beta: float | None = field(default=None, metadata={"help": "KL strength β (default 0.1 for dpo)."})
    loss_type: list[str] = field(default_factory=lambda: ["sigmoid"], metadata={
        "help": "DPO losses, summed: sigmoid, ipo, hinge, robust, bco_pair, sppo_hard, nca_pair, apo_zero, apo_down."})
    loss_weights: list[float] = field(default_factory=list, metadata={"help": "Weight of each --loss_type (default 1)."})
    label_smoothing: float = field(default=0.0, metadata={
        "help": "Assumed label-flip rate ε: cDPO with sigmoid, the robust loss's ε."})
    rpo_alpha: float | None = field(default=None, metadata={"help": "Add rpo_alpha × NLL of the chosen answer (RPO)."})

    def __post_init__(self) -> None:
        from swift.rlhf.dpo import DPO_LOSSES

        if self.rlhf_type not in RLHF_TYPES:
            raise SwiftError(f"--rlhf_type {self.rlhf_type!r} is not one of {', '.join(RLHF_TYPES)}")
        if isinstance(self.loss_type, str):
            self.loss_type = [self.loss_type]
        for name in self.loss_type:
            DPO_LOSSES.get(name)  # a miss lists the valid names
        if self.loss_weights and len(self.loss_weights) != len(self.loss_type):
            raise SwiftError(f"--loss_weights has {len(self.loss_weights)} values for {len(self.loss_type)} --loss_type")
        if not 0 <= self.label_smoothing < 0.5:
            raise SwiftError(f"--label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.beta is None:
            self.beta = DEFAULT_BETA[self.rlhf_type]
        if self.beta <= 0:
            raise SwiftError(f"--beta must be > 0, got {self.beta}")


class RLHFArguments(SftArguments):
    """`swift rlhf`: offline preference alignment on chosen/rejected pairs."""

    parts: ClassVar[dict[str, type]] = {**SftArguments.parts, "rlhf_args": RlhfArguments}
    defaults: ClassVar[dict[str, Any]] = {"loss_scale": "last_round"}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.packing:
            raise SwiftError("--packing is not supported with swift rlhf (chosen and rejected are paired per row)")

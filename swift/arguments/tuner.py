from __future__ import annotations

from dataclasses import dataclass, field

from swift.utils.registry import SwiftError

TUNER_TYPES = ("lora", "full")


@dataclass
class TunerArguments:
    tuner_type: str = field(default="lora", metadata={"help": "lora or full (full fine-tuning; combine with --freeze_parameters)."})
    train_type: str | None = field(default=None, metadata={"help": "Old name of --tuner_type."})
    lora_rank: int = field(default=8, metadata={"help": "LoRA rank r."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha (scale = alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input."})
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"], metadata={
        "help": "Modules that get LoRA: all-linear (every linear layer but the output head) or module names."})
    freeze_parameters: list[str] = field(default_factory=list, metadata={
        "help": "Full tuning: parameter-name prefixes to freeze (e.g. model.embed_tokens)."})
    freeze_parameters_ratio: float = field(default=0.0, metadata={
        "help": "Full tuning: freeze this fraction of parameters from the bottom of the model."})
    trainable_parameters: list[str] = field(default_factory=list, metadata={
        "help": "Full tuning: prefixes kept trainable even when frozen by the two flags above."})
    adapters: list[str] = field(default_factory=list, metadata={"help": "Existing LoRA adapter directories to load (and keep training)."})

    def __post_init__(self) -> None:
        if self.train_type is not None:
            self.tuner_type, self.train_type = self.train_type, None
        if self.tuner_type not in TUNER_TYPES:
            raise SwiftError(f"--tuner_type {self.tuner_type!r} is not one of {', '.join(TUNER_TYPES)}")
        if not 0.0 <= self.freeze_parameters_ratio <= 1.0:
            raise SwiftError(f"--freeze_parameters_ratio must be in [0, 1], got {self.freeze_parameters_ratio}")
        if self.tuner_type == "lora" and (self.freeze_parameters or self.freeze_parameters_ratio):
            raise SwiftError("--freeze_parameters / --freeze_parameters_ratio apply to --tuner_type full")

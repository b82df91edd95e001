from __future__ import annotations

from dataclasses import dataclass, field

from swift.utils.registry import SwiftError

TUNER_TYPES = ("lora", "full")
MS_SWIFT_TUNERS = ("adalora", "llamapro", "adapter", "vera", "boft", "fourierft", "reft", "longlora", "bone")
INIT_WEIGHTS = ("true", "false", "gaussian", "pissa", "olora")


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
    target_regex: str | None = field(default=None, metadata={
        "help": "LoRA: a regular expression over module names (full match) choosing the LoRA modules; overrides "
                "--target_modules."})
    modules_to_save: list[str] = field(default_factory=list, metadata={
        "help": "LoRA: modules (e.g. embed_tokens, lm_head) trained in full and saved beside the adapter."})
    lora_bias: str = field(default="none", metadata={"help": "LoRA: biases to train: none, all, or lora_only."})
    use_dora: bool = field(default=False, metadata={"help": "LoRA: weight-decomposed LoRA (DoRA)."})
    use_rslora: bool = field(default=False, metadata={"help": "LoRA: rank-stabilised scaling alpha / sqrt(r)."})
    init_weights: str = field(default="true", metadata={
        "help": "LoRA initialisation: true (PEFT's default: B = 0), false (B random too), gaussian, pissa or olora."})
    lora_dtype: str | None = field(default=None, metadata={
        "help": "LoRA: dtype of the adapter weights (float32, bfloat16, float16; default: the model's)."})

    def new_lora_flags(self) -> list[str]:
        """The flags set away from their defaults that only a new LoRA adapter reads (with --adapters
        the loaded one keeps its own configuration: the command decides whether it builds another)."""
        return [flag for flag, value, default in (
            ("lora_rank", self.lora_rank, 8), ("lora_alpha", self.lora_alpha, 32), ("lora_dropout", self.lora_dropout, 0.05),
            ("target_modules", list(self.target_modules), ["all-linear"]), ("target_regex", self.target_regex, None),
            ("modules_to_save", self.modules_to_save, []), ("lora_bias", self.lora_bias, "none"),
            ("use_dora", self.use_dora, False), ("use_rslora", self.use_rslora, False),
            ("init_weights", str(self.init_weights).lower(), "true"), ("lora_dtype", self.lora_dtype, None))
            if value != default]

    def __post_init__(self) -> None:
        if self.train_type is not None:
            self.tuner_type, self.train_type = self.train_type, None
        if self.tuner_type in MS_SWIFT_TUNERS:
            raise SwiftError(f"--tuner_type {self.tuner_type} is an ms-swift tuner this version does not support "
                             f"(it has {', '.join(TUNER_TYPES)})")
        if self.tuner_type not in TUNER_TYPES:
            raise SwiftError(f"--tuner_type {self.tuner_type!r} is not one of {', '.join(TUNER_TYPES)}")
        if not 0.0 <= self.freeze_parameters_ratio <= 1.0:
            raise SwiftError(f"--freeze_parameters_ratio must be in [0, 1], got {self.freeze_parameters_ratio}")
        if self.lora_bias not in ("none", "all", "lora_only"):
            raise SwiftError(f"--lora_bias {self.lora_bias!r} is not one of none, all, lora_only")
        if str(self.init_weights).lower() not in INIT_WEIGHTS:
            raise SwiftError(f"--init_weights {self.init_weights!r} is not one of {', '.join(INIT_WEIGHTS)}")
        if self.lora_dtype not in (None, "float32", "bfloat16", "float16"):
            raise SwiftError(f"--lora_dtype {self.lora_dtype!r} is not one of float32, bfloat16, float16")
        if self.target_regex is not None:
            import re

            try:
                re.compile(self.target_regex)
            except re.error as e:
                raise SwiftError(f"--target_regex {self.target_regex!r} is not a valid regular expression: {e}") from None
        if isinstance(self.target_modules, str):  # the Python API's `target_modules="all-linear"`
            self.target_modules = [self.target_modules]
        new_lora = self.new_lora_flags()
        if new_lora and self.tuner_type != "lora":
            raise SwiftError(f"--{new_lora[0]} shapes a new LoRA adapter; it does not apply to --tuner_type full")
        if self.tuner_type == "lora" and (self.freeze_parameters or self.freeze_parameters_ratio
                                          or self.trainable_parameters):
            raise SwiftError("--freeze_parameters / --freeze_parameters_ratio / --trainable_parameters apply to "
                             "--tuner_type full")
        self._check_adapters()

    def _check_adapters(self) -> None:
        """Training goes on from one LoRA adapter (a second would load untrained, and its save would
        write into its own input folder); with it, only the adapter trains."""
        import os

        if isinstance(self.adapters, str):
            self.adapters = [self.adapters]
        if len(self.adapters) > 1:
            raise SwiftError(f"--adapters: training continues one adapter, got {len(self.adapters)}; fold them into "
                             "one model first with `swift merge-lora --adapters A B` and train on it")
        for path in self.adapters:
            if not os.path.isfile(os.path.join(path, "adapter_config.json")):
                raise SwiftError(f"--adapters {path}: no adapter_config.json there (not a LoRA adapter directory)")
        freezing = [flag for flag in ("freeze_parameters", "freeze_parameters_ratio", "trainable_parameters")
                    if getattr(self, flag)]
        if self.adapters and freezing:
            raise SwiftError(f"--{freezing[0]} shapes full tuning; with --adapters only the loaded LoRA adapter "
                             "trains")

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from swift.utils.registry import SwiftError

TRUNCATION = ("delete", "left", "right")
LOSS_SCALES = ("default", "last_round", "all")


@dataclass
class TemplateArguments:
    template: str | None = field(default=None, metadata={
        "help": "Chat template: chatml, qwen, llama3, jinja (the tokenizer's own). Inferred from the model when omitted."})
    system: str | None = field(default=None, metadata={"help": "System prompt used when a conversation has none."})
    max_length: int = field(default=2048, metadata={"help": "Maximum tokens per sample (and per packed row)."})
    truncation_strategy: Literal["delete", "left", "right"] = field(default="delete", metadata={
        "help": "Samples longer than --max_length: delete (drop and count), left (keep the end), right (keep the start)."})
    loss_scale: Literal["default", "last_round", "all"] = field(default="default", metadata={
        "help": "Tokens that get loss: default (every assistant turn), last_round (the last one), all (every token)."})

    def __post_init__(self) -> None:
        if self.truncation_strategy not in TRUNCATION:
            raise SwiftError(f"--truncation_strategy {self.truncation_strategy!r} is not one of {', '.join(TRUNCATION)}")
        if self.loss_scale not in LOSS_SCALES:
            raise SwiftError(f"--loss_scale {self.loss_scale!r} is not one of {', '.join(LOSS_SCALES)}")
        if self.max_length < 2:
            raise SwiftError(f"--max_length must be at least 2, got {self.max_length}")


TRAINING_ONLY = frozenset({"truncation_strategy", "loss_scale"})  # template flags that shape training rows only


def refuse_training_only(args, who: str) -> None:
    """Stop on --truncation_strategy or --loss_scale set for a command that only generates
    (`args`: ComposedArguments with a `template_args` part; `who` names it in the line)."""
    import dataclasses

    read = {f.name for f in dataclasses.fields(TemplateArguments)} - TRAINING_ONLY
    args.refuse_unread(("template_args",), read, f"applies to training; {who} does not read it")

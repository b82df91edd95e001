from __future__ import annotations

import dataclasses
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


@dataclass
class PromptTemplateArguments(TemplateArguments):
    """The template flags of the commands that generate (infer, deploy, eval, sample, app, rollout):
    --max_length caps a prompt, as ms-swift's inference does; --loss_scale (training) is refused."""

    max_length: int | None = field(default=None, metadata={
        "help": "Longest prompt in tokens (default: the model's context); --truncation_strategy says what happens "
                "to a longer one: delete (refused, that request alone), left (keep its end), right (keep its start)."})

    def __post_init__(self) -> None:
        if self.max_length is not None:
            super().__post_init__()
        elif self.truncation_strategy != "delete":
            raise SwiftError(f"--truncation_strategy {self.truncation_strategy} says what happens to a prompt over "
                             "--max_length, which is not given (no prompt is cut but by the model's context)")
        if self.loss_scale != "default":
            raise SwiftError("--loss_scale applies to training (which tokens get loss); this command only generates")


def refuse_prompt_limit(args, who: str) -> None:
    """Stop on --max_length or --truncation_strategy given to a mode whose prompts are not encoded here."""
    read = {f.name for f in dataclasses.fields(PromptTemplateArguments)} - {"max_length", "truncation_strategy"}
    args.refuse_unread(("template_args",), read, f"caps prompts this command encodes; {who}")

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
    max_length: int | None = field(default=None, metadata={
        "help": "Maximum tokens per sample (and per packed row); default: the model's context length (its config's "
                "max_position_embeddings, as ms-swift)."})
    truncation_strategy: Literal["delete", "left", "right"] = field(default="delete", metadata={
        "help": "Samples longer than --max_length: delete (drop and count), left (keep the end), right (keep the start)."})
    loss_scale: Literal["default", "last_round", "all"] = field(default="default", metadata={
        "help": "Tokens that get loss: default (every assistant turn), last_round (the last one), all (every token)."})

    def __post_init__(self) -> None:
        if self.truncation_strategy not in TRUNCATION:
            raise SwiftError(f"--truncation_strategy {self.truncation_strategy!r} is not one of {', '.join(TRUNCATION)}")
        if self.loss_scale not in LOSS_SCALES:
            raise SwiftError(f"--loss_scale {self.loss_scale!r} is not one of {', '.join(LOSS_SCALES)}")
        if self.max_length is not None and self.max_length < 2:
            raise SwiftError(f"--max_length must be at least 2, got {self.max_length}")


# the config keys that hold a model's context length (ms-swift's list); the smallest one given counts
CONTEXT_KEYS = ("seq_length", "max_position_embeddings", "n_positions", "model_max_length", "seq_len", "max_seq_len",
                "max_sequence_length", "max_seq_length")
FALLBACK_MAX_LENGTH = 2048


def model_max_length(config) -> int:
    """--max_length's default: the model's context length from its config (a multimodal model's text
    config), as ms-swift takes it (before 2026-12-07 the default was 2048 for every model). A config
    that names none gets 2048, where ms-swift caps nothing: an uncapped long sample would run out of
    memory late in a run, while one over the cap is dropped and counted before training starts."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    lengths = [v for k in CONTEXT_KEYS if isinstance(v := getattr(text, k, None), int) and v > 1]
    return min(lengths) if lengths else FALLBACK_MAX_LENGTH


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

"""Shared fixtures: the built-in tiny model and tokenizer, built offline from the repo's assets."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny():
    from swift.model import load_model

    model, tokenizer, info = load_model("builtin:tiny-chat")
    return model, tokenizer, info


@pytest.fixture(scope="session")
def tokenizer(tiny):
    return tiny[1]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tiny):
    """The tiny model saved as an ordinary local HF directory."""
    path = tmp_path_factory.mktemp("tiny-chat")
    model, tokenizer, _ = tiny
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def train_argv(output_dir, *extra: str) -> list[str]:
    """A fast sft command line on the tiny model and built-in arithmetic data."""
    return ["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft#64", "--output_dir", str(output_dir),
            "--max_steps", "4", "--per_device_train_batch_size", "4", "--logging_steps", "1",
            "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", *extra]

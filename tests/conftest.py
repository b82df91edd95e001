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
            "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--add_version", "false", *extra]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def quickstart(tmp_path_factory):
    """examples/quickstart.sh (pt then sft on built-in arithmetic), run once per test session.

    Returns (its stdout, its output dir); learning checks of later stages (DPO, RM, GRPO) start
    from `<dir>/sft`. Set SWIFT_TEST_QUICKSTART to an existing output dir to reuse one."""
    import subprocess

    reuse = os.environ.get("SWIFT_TEST_QUICKSTART")
    if reuse and os.path.exists(os.path.join(reuse, "sft", "result.json")):
        return None, reuse
    out = tmp_path_factory.mktemp("quickstart") / "qs"
    proc = subprocess.run(["bash", os.path.join(ROOT, "examples", "quickstart.sh")], cwd=out.parent,
                          env={**os.environ, "OUT": str(out)}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, str(out)


# a reward that varies between completions (tests/plugins/text_length_reward.py)
TEXT_LENGTH = ["--reward_funcs", "text_length", "--external_plugins",
               os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins", "text_length_reward.py")]

# tests run by hand (SWIFT_TEST_BY_HAND=1) because CI's 60-minute budget has no room for them; README's
# "Verified on" table says which and when they were run
BY_HAND = pytest.mark.skipif(not os.environ.get("SWIFT_TEST_BY_HAND"),
                             reason="run by hand (SWIFT_TEST_BY_HAND=1): CI's 60-minute budget has no room for it")

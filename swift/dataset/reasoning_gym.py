"""reasoning-gym's procedural tasks as datasets, scored by each task's own scorer.

`--dataset reasoning_gym:<task>[:train|eval][#N]` generates N rows (default 500) of a
reasoning-gym task (`pip install -e ".[gym]"`), e.g. `reasoning_gym:basic_arithmetic#1000`; the
task's configuration goes after a `?`: `reasoning_gym:basic_arithmetic?max_terms=2&operators=[+]`
(values read as YAML). Questions are split into train and eval by a hash of their text (about 5%
eval), so the two splits never share a question; within a split questions are distinct. Each row is
the question as a user message, the answer as `solution`, and the whole entry (question, answer,
metadata) as `reasoning_gym_entry` (JSON), which the `reasoning_gym` reward hands back to the task's
`score_answer`.
"""
from __future__ import annotations

import functools
import hashlib
import json
from typing import Iterator

from swift.plugin import register
from swift.rewards.base import ORM
from swift.utils.query import query_args
from swift.utils.registry import SwiftError, closest

PREFIX = "reasoning_gym:"
DEFAULT_SIZE = 500
SEED = 42  # reasoning-gym's examples use 42


def _module():
    try:
        import reasoning_gym
    except ImportError:
        raise SwiftError('reasoning_gym datasets need the reasoning-gym package: pip install -e ".[gym]"') from None
    return reasoning_gym


def parse_task(source: str) -> tuple[str, dict]:
    """`reasoning_gym:basic_arithmetic?max_terms=2` → ("basic_arithmetic", {"max_terms": 2})."""
    task, _, query = source[len(PREFIX):].partition("?")
    config = query_args(source, query)
    names = _module().factory.DATASETS
    if task not in names:
        raise SwiftError(f"--dataset {source}: reasoning-gym has no task '{task}'.{closest(task, names)}")
    return task, config


def is_eval(question: str) -> bool:
    return hashlib.md5(question.encode()).digest()[0] < 13  # ~5% of 256


def iter_rows(source: str, split: str, n: int | None) -> Iterator[tuple[str, dict]]:
    """(origin, row) for `n` distinct questions of the split, generated in chunks of fresh seeds."""
    rg = _module()
    task, config = parse_task(source)
    want, seen, start, attempts = n or DEFAULT_SIZE, set(), SEED, 0
    size = max(64, 2 * want if split == "train" else 25 * want)
    while len(seen) < want:
        # item i of a task is drawn from seed + i: chunks start where the last one ended (never overlap)
        try:
            entries = rg.create_dataset(task, size=size, seed=start, **config)
        except (TypeError, ValueError, AssertionError) as e:
            raise SwiftError(f"--dataset {source}: reasoning-gym refused the configuration: {e}") from None
        added = 0
        for entry in entries:
            question = entry["question"]
            if question in seen or is_eval(question) != (split == "eval"):
                continue
            seen.add(question)
            added += 1
            yield f"{source}:{split} row {len(seen)}", {
                "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": str(entry["answer"])}],
                "solution": str(entry["answer"]),
                "reasoning_gym_entry": json.dumps(entry, default=str)}
            if len(seen) == want:
                return
        start += size
        attempts = 0 if added else attempts + 1
        if attempts == 3:
            raise SwiftError(f"--dataset {source}: the task has only {len(seen)} distinct {split} questions in this "
                             f"configuration; ask for fewer (#N) or widen the configuration")


@functools.lru_cache(maxsize=None)
def _scorer(task: str):
    return _module().get_score_answer_fn(task)


@register("reward", "reasoning_gym")
class ReasoningGymScore(ORM):
    """The task's own `score_answer(answer, entry)` in [0, 1]; the answer is the text inside the
    last <answer></answer> when the completion has one (reasoning-gym's prompt asks for it), else the
    whole completion."""

    def __call__(self, completions, reasoning_gym_entry=None, **kwargs):
        if reasoning_gym_entry is None:
            raise SwiftError("the reasoning_gym reward needs rows from --dataset reasoning_gym:<task>")
        from reasoning_gym.utils import extract_answer

        out = []
        for completion, text in zip(completions, reasoning_gym_entry):
            entry = json.loads(text)
            answer = extract_answer(completion)
            answer = (completion if answer is None else answer).strip()
            out.append(float(_scorer(entry["metadata"]["source_dataset"])(answer, entry)))
        return out

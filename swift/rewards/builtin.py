"""ms-swift's built-in rewards: accuracy, format, react_format, cosine, repetition, soft_overlong, toolbench."""
from __future__ import annotations

import functools
import json
import math
import re

from swift.rewards.base import ORM
from swift.plugin import register
from swift.utils.registry import SwiftError

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _option(args, name: str, default):
    value = getattr(args, name, None) if args is not None else None
    return default if value is None else value


@functools.lru_cache(maxsize=4096)
def _parse_gold(solution: str):
    from math_verify import parse

    return parse(solution)


def is_correct(completion: str, solution) -> float:
    """1.0 when the completion's answer (`<answer>` content if present, else what math-verify
    extracts: the last boxed value or number) equals the solution; an unparseable solution gives 0."""
    from math_verify import parse, verify

    gold = _parse_gold(str(solution))
    if not gold:
        return 0.0
    match = ANSWER.findall(completion)
    answer = match[-1].strip() if match else completion
    if answer.strip() == str(solution).strip():
        return 1.0  # identical text: math-verify would agree, and it is slow
    try:
        return float(verify(gold, parse(answer)))
    except Exception:  # math-verify raises on some malformed expressions
        return 0.0


@register("reward", "accuracy")
class Accuracy(ORM):
    def __call__(self, completions, solution, **kwargs):
        return [is_correct(c, s) for c, s in zip(completions, solution)]


@register("reward", "format")
class Format(ORM):
    pattern = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>(?![\s\S])", re.DOTALL)

    def __call__(self, completions, **kwargs):
        return [1.0 if self.pattern.match(c) else 0.0 for c in completions]


@register("reward", "react_format")
class ReActFormat(ORM):
    pattern = re.compile(r"^<think>.*?</think>\s*Action:.*?Action Input:.*?$", re.DOTALL)

    def __call__(self, completions, **kwargs):
        return [1.0 if self.pattern.match(c) else 0.0 for c in completions]


def _lengths(completions, kwargs) -> list[int]:
    ids = kwargs.get("response_token_ids")
    return [len(x) for x in ids] if ids is not None else [len(c.split()) for c in completions]


@register("reward", "cosine")
class Cosine(ORM):
    """arXiv 2502.03373: with t completion tokens and T = `cosine_max_len`, the reward moves along half
    a cosine from its value at t = 0 to its value at t = T: correct 1.0 → 0.5, wrong −0.5 → 0.0."""

    def __init__(self, args=None, **kwargs):
        super().__init__(args)
        self.correct = (_option(args, "cosine_min_len_value_correct", 1.0), _option(args, "cosine_max_len_value_correct", 0.5))
        self.wrong = (_option(args, "cosine_min_len_value_wrong", -0.5), _option(args, "cosine_max_len_value_wrong", 0.0))
        self.max_len = _option(args, "cosine_max_len", None) or _option(args, "max_completion_length", 512)

    def __call__(self, completions, solution, **kwargs):
        out = []
        for c, s, t in zip(completions, solution, _lengths(completions, kwargs)):
            start, end = self.correct if is_correct(c, s) else self.wrong
            progress = min(t, self.max_len) / self.max_len
            out.append(start - (start - end) * (1 - math.cos(math.pi * progress)) / 2)
        return out


@register("reward", "repetition")
class Repetition(ORM):
    """(1 − unique/total n-grams) × max_penalty over lower-cased whitespace words; too short → 0."""

    def __init__(self, args=None, **kwargs):
        super().__init__(args)
        self.n = _option(args, "repetition_n_grams", 3)
        self.max_penalty = _option(args, "repetition_max_penalty", -1.0)

    def __call__(self, completions, **kwargs):
        out = []
        for c in completions:
            words = c.lower().split()
            grams = [tuple(words[i:i + self.n]) for i in range(len(words) - self.n + 1)]
            out.append(0.0 if not grams else (1 - len(set(grams)) / len(grams)) * self.max_penalty)
        return out


def soft_overlong_lengths(args) -> tuple[int, int]:
    """(L_max, L_cache) of the soft_overlong reward: `--soft_max_length` (default
    `--max_completion_length`) and `--soft_cache_length`, which must be given and below L_max, as
    ms-swift asserts (before 2026-12-07 a missing one became L_max // 4 and one equal to L_max passed)."""
    max_len = _option(args, "soft_max_length", None) or _option(args, "max_completion_length", 512)
    cache = _option(args, "soft_cache_length", None)
    if cache is None:
        where = "" if hasattr(args, "soft_cache_length") else " (a flag of `swift rlhf`; this command has none)"
        raise SwiftError(f"the soft_overlong reward needs --soft_cache_length{where}: L_cache, the last tokens "
                         f"before --soft_max_length ({max_len}) over which the penalty grows to -1")
    if not 0 < cache < max_len:
        raise SwiftError(f"--soft_cache_length {cache} must be in 1..{max_len - 1}: below --soft_max_length "
                         f"(or --max_completion_length), {max_len}")
    return max_len, cache


@register("reward", "soft_overlong")
class SoftOverlong(ORM):
    """DAPO's soft overlong punishment (arXiv 2503.14476): min(0, −(len − (L_max − L_cache)) / L_cache)
    in tokens."""

    def __init__(self, args=None, **kwargs):
        super().__init__(args)
        self.max_len, self.cache = soft_overlong_lengths(args)

    def __call__(self, completions, **kwargs):
        start = self.max_len - self.cache
        return [min(0.0, -(t - start) / self.cache) for t in _lengths(completions, kwargs)]


ACTION = re.compile(r"Action:\s*(.*?)\s*Action Input:\s*(.*)", re.DOTALL)


def _last_action(text: str) -> tuple[str, str] | None:
    matches = list(ACTION.finditer(text))
    if not matches:
        return None
    name, arguments = matches[-1].groups()
    return name.strip(), arguments.strip()


def _json_f1(predicted: dict, gold: dict) -> float:
    """Key-level F1; a right key with a wrong value counts half."""
    if not predicted and not gold:
        return 1.0
    hits = sum(1.0 if predicted[k] == gold[k] else 0.5 for k in predicted if k in gold)
    precision, recall = hits / max(len(predicted), 1), hits / max(len(gold), 1)
    return 0.0 if hits == 0 else 2 * precision * recall / (precision + recall)


@register("reward", "toolbench")
class ToolBench(ORM):
    """1.0 when the completion's last `Action:` equals the solution's and its `Action Input:` matches
    (JSON inputs: key-level F1 must be 1; other inputs: equal strings), else 0.0."""

    def __call__(self, completions, solution, **kwargs):
        out = []
        for c, s in zip(completions, solution):
            pred, gold = _last_action(c), _last_action(str(s))
            if pred is None or gold is None or pred[0] != gold[0]:
                out.append(0.0)
                continue
            try:
                f1 = _json_f1(json.loads(pred[1]), json.loads(gold[1]))
            except (json.JSONDecodeError, TypeError, AttributeError):
                f1 = float(pred[1] == gold[1])
            out.append(1.0 if f1 == 1.0 else 0.0)
        return out


@register("reward", "gym_reward")
class GymReward(ORM):
    """The summed environment reward of a `--multi_turn_scheduler gym` trajectory."""

    def __call__(self, completions, gym_reward=None, **kwargs):
        return list(gym_reward) if gym_reward is not None else [None] * len(completions)

"""Build the reward functions a run asks for and score completions with them.

A `--reward_funcs` entry is a registered name (built-in or added by an `--external_plugins`
file), a `module:Class` path, or a `.py` file in OpenRLHF's style defining
`reward_func(queries, prompts, labels, **kwargs)`. `--reward_model` (a local seq_cls dir) and
`--reward_model_url` (`swift deploy`'s `/v1/rewards`) add one function each."""
from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import urllib.request
from typing import Any, Callable

from swift.rewards.base import orms
from swift.utils.plugins import import_plugin
from swift.utils.registry import SwiftError


class OpenRLHFReward:
    """Adapter for an OpenRLHF reward file: `reward_func(queries, prompts, labels, **kw)` returning a
    tensor/list or a dict with "rewards" (and optional "scores", "extra_logs")."""

    def __init__(self, path: str):
        module = import_plugin(path)
        if not hasattr(module, "reward_func"):
            raise SwiftError(f"--reward_funcs {path}: the file defines no reward_func(queries, prompts, labels)")
        self.func = module.reward_func
        self.__name__ = os.path.splitext(os.path.basename(path))[0]

    def __call__(self, completions, prompt_texts=None, **columns):
        prompts = prompt_texts or [""] * len(completions)
        labels = columns.get("solution") or columns.get("label") or columns.get("labels") or [None] * len(completions)
        out = self.func([p + c for p, c in zip(prompts, completions)], prompts, labels)
        rewards = out["rewards"] if isinstance(out, dict) else out
        return [float(r) for r in (rewards.tolist() if hasattr(rewards, "tolist") else rewards)]


class RewardModelReward:
    """A local sequence-classification reward model scoring the conversation with the completion."""

    __name__ = "reward_model"

    def __init__(self, path: str, template_name: str | None = None):
        from swift.infer.reward import RewardScorer
        from swift.model import load_model
        from swift.template import get_template, infer_template

        from swift.model.loader import whole_weights

        with whole_weights():  # under ZeRO-3 too: it scores outside the trainer's forwards, on each rank alone
            model, tokenizer, info = load_model(path, task_type="seq_cls")
        template = get_template(template_name or infer_template(info.model_type, tokenizer), tokenizer)
        self.scorer = RewardScorer(model, tokenizer, template)

    def __call__(self, completions, messages, **kwargs):
        return self.scorer.score([self.scorer.render([*m, {"role": "assistant", "content": c}])
                                  for c, m in zip(completions, messages)])


class RemoteRewardModel:
    """`swift deploy --task_type seq_cls` (or any server with its `/v1/rewards` route)."""

    __name__ = "reward_model_url"

    def __init__(self, url: str, timeout: float = 60.0):
        self.url = url.rstrip("/")
        self.url = self.url if self.url.endswith("/v1/rewards") else self.url + "/v1/rewards"
        self.timeout = timeout

    def __call__(self, completions, messages, **kwargs):
        body = {"messages": [[*m, {"role": "assistant", "content": c}] for c, m in zip(completions, messages)]}
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return [float(r) for r in json.load(response)["rewards"]]
        except OSError as e:
            raise SwiftError(f"--reward_model_url {self.url}: {e}") from None


def build_reward_funcs(names: list[str], args=None, reward_model: str | None = None,
                       reward_model_url: str | None = None, process: bool = False) -> list[tuple[str, Callable]]:
    """`process`: a process reward model scores the steps too, so no outcome reward is needed."""
    funcs: list[tuple[str, Callable]] = []
    for name in names:
        if name.endswith(".py"):
            func = OpenRLHFReward(name)
            funcs.append((func.__name__, func))
            continue
        obj = orms.get(name)
        funcs.append((name, obj(args) if inspect.isclass(obj) else obj))
    if reward_model:
        funcs.append(("reward_model", RewardModelReward(reward_model, getattr(args, "template", None))))
    if reward_model_url:
        funcs.append(("reward_model_url", RemoteRewardModel(reward_model_url)))
    if not funcs and not process:
        raise SwiftError("online RL needs a reward: --reward_funcs, --reward_model, --reward_model_url or --prm_model")
    return funcs


class RewardManager:
    """Calls every function on a batch, awaits async ones concurrently, and combines them:
    total = Σ w_i r_i over the functions that did not return None for the row."""

    def __init__(self, funcs: list[tuple[str, Callable]], weights: list[float] | None = None):
        if weights and len(weights) != len(funcs):
            raise SwiftError(f"--reward_weights has {len(weights)} values for {len(funcs)} reward functions "
                             f"({', '.join(n for n, _ in funcs)})")
        self.funcs = funcs
        self.weights = weights or [1.0] * len(funcs)

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.funcs]

    def __call__(self, completions: list[str], columns: dict[str, list[Any]]) -> tuple[list[float], list[list[float]]]:
        """Return (weighted totals, per-function values with NaN for None) for every row."""
        per_func: list[list[float] | None] = [None] * len(self.funcs)
        pending = []
        for i, (name, func) in enumerate(self.funcs):
            if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):
                pending.append((i, name, func))
                continue
            try:
                result = func(completions, **columns)
            except Exception as e:  # a user's function failed: find and name the row
                self._raise(name, func, completions, columns, e)
            per_func[i] = self._checked(name, completions, result)
        if pending:
            async def gather():
                return await asyncio.gather(*(f(completions, **columns) for _, _, f in pending), return_exceptions=True)

            for (i, name, func), result in zip(pending, asyncio.run(gather())):
                if isinstance(result, BaseException):
                    self._raise(name, func, completions, columns, result)
                per_func[i] = self._checked(name, completions, result)
        totals = []
        for row in range(len(completions)):
            values = [(w, per_func[i][row]) for i, w in enumerate(self.weights)]
            present = [w * v for w, v in values if not math.isnan(v)]
            totals.append(sum(present) if present else float("nan"))
        return totals, per_func

    @staticmethod
    def _checked(name, completions, result) -> list[float]:
        if result is None or len(result) != len(completions):
            raise SwiftError(f"reward function '{name}' returned {0 if result is None else len(result)} values "
                             f"for {len(completions)} completions")
        return [float("nan") if v is None else float(v) for v in result]

    @staticmethod
    def _raise(name, func, completions, columns, error: BaseException):
        """Re-run row by row to name the first failing row, then stop the run with one line."""
        for row in range(len(completions)):
            one = {k: v[row:row + 1] for k, v in columns.items()}
            try:
                result = func(completions[row:row + 1], **one)
                if inspect.isawaitable(result):
                    asyncio.run(result)
            except Exception as e:
                shown = ", ".join(f"{k}={v[row]!r}"[:80] for k, v in columns.items()
                                  if isinstance(v[row], (str, int, float, bool)) and k != "prompt_texts")
                raise SwiftError(f"reward function '{name}' failed on row {row} of the batch ({shown}; "
                                 f"completion {completions[row][:60]!r}): {type(e).__name__}: {e}") from None
        raise SwiftError(f"reward function '{name}' failed: {type(error).__name__}: {error}") from None

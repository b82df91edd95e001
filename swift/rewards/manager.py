"""Build the reward functions a run asks for and score completions with them.

A `--reward_funcs` entry is
  - a registered name (built in, or added by a plugin: swift.plugin.register("reward", ...)), called
    `f(completions, **columns)`;
  - `module:attr`: a class (an ORM) is built with the run's arguments; a function is called as
    above, `f(completions, **columns)`;
  - `file.py:func` or `package.module.func` (TRL's CLI spelling): a TRL reward function, called
    TRL's way (`TRLReward`); a class there is an ORM, as above;
  - a `.py` file in OpenRLHF's style defining `reward_func(queries, prompts, labels, **kwargs)`.
verl's `--custom_reward_function_path FILE --custom_reward_function_name NAME` adds its
`compute_score(data_source, solution_str, ground_truth, extra_info)` (`VerlReward`).
`--reward_model` (a local seq_cls dir) and `--reward_model_url` (`swift deploy`'s `/v1/rewards`)
add one function each."""
from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import math
import os
import urllib.request
from typing import Any, Callable

from swift.rewards.base import orms
from swift.plugin import import_file
from swift.utils.registry import SwiftError


class OpenRLHFReward:
    """Adapter for an OpenRLHF reward file: `reward_func(queries, prompts, labels, **kw)` returning a
    tensor/list or a dict with "rewards" (and optional "scores", "extra_logs")."""

    def __init__(self, path: str):
        module = import_file(path, "--reward_funcs")
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


def _ignore(*args, **kwargs) -> None:
    """TRL's log_extra/log_metric where nothing collects them (outside a trainer)."""


class TRLReward:
    """A TRL reward function: called with keywords `prompts`, `completions`, `completion_ids` and every
    other dataset column (TRL passes all but the prompt), plus `trainer_state`, `log_metric(name, value)`
    (logged with the step's metrics) and `log_extra(column, values)` (accepted; not written to
    completions.jsonl) from the trainer (`RewardManager.context`). Prompts and
    completions are conversational (lists of {"role", "content"}: in a multi-turn rollout every
    message after the prompt, tool messages included) unless the dataset gave its prompt as text
    (TRL's standard format), in which case both are strings (the last answer). Returns floats or None."""

    def __init__(self, func: Callable, name: str):
        self.func = func
        self.__name__ = name
        self.is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
            getattr(func, "__call__", None))

    def _arguments(self, completions, columns):
        columns = {"trainer_state": None, "log_metric": _ignore, "log_extra": _ignore, **columns}
        whole = columns.pop("messages", None)  # from the manager: the whole conversation; called directly: the prompt
        messages = columns.pop("prompt_messages", None) or whole or [[] for _ in completions]
        columns.pop("rollout_infos", None)  # ms-swift's column; TRL's functions get its keys as columns
        prompt_texts = columns.pop("prompt_texts", None)
        standard = columns.pop("prompt", None)  # the dataset's own text prompt, when it had one
        ids = columns.pop("response_token_ids", None) or [[] for _ in completions]
        trajectories = columns.pop("trajectory_messages", None)
        if standard is not None and all(isinstance(p, str) for p in standard):
            prompts, outs = list(standard), list(completions)
        elif trajectories is not None and all(trajectories):  # as TRL: the prompt as generated from (an environment may have
            # extended it) and every turn after it, tool calls and results included
            prompts = [list(t[:len(m)]) for t, m in zip(trajectories, messages)]
            outs = [list(t[len(m):]) for t, m in zip(trajectories, messages)]
        else:
            prompts = [list(m) for m in messages]
            outs = [[{"role": "assistant", "content": c}] for c in completions]
        del prompt_texts  # TRL gives the un-templated prompt, above
        return dict(prompts=prompts, completions=outs, completion_ids=ids, **columns)

    def __call__(self, completions, **columns):
        if self.is_async:
            return self._acall(completions, **columns)
        return self.func(**self._arguments(completions, columns))

    async def _acall(self, completions, **columns):
        return await self.func(**self._arguments(completions, columns))


class VerlReward:
    """verl's `compute_score(data_source, solution_str, ground_truth, extra_info)`, called row by row
    with verl's data columns: `data_source`, `reward_model["ground_truth"]` (else a `ground_truth` or
    `solution` column), `extra_info`. A dict return gives its "score"."""

    def __init__(self, path: str, name: str = "compute_score"):
        module = import_file(path, "--custom_reward_function_path")
        if not callable(getattr(module, name, None)):
            raise SwiftError(f"--custom_reward_function_path {path}: the file defines no function {name} "
                             f"(--custom_reward_function_name)")
        self.func = getattr(module, name)
        self.__name__ = name

    @staticmethod
    def _ground_truth(row: int, columns: dict):
        spec = (columns.get("reward_model") or [None] * (row + 1))[row]
        if isinstance(spec, dict) and "ground_truth" in spec:
            return spec["ground_truth"]
        for key in ("ground_truth", "solution"):
            if key in columns:
                return columns[key][row]
        return None

    def __call__(self, completions, **columns):
        out = []
        for row, completion in enumerate(completions):
            score = self.func(data_source=(columns.get("data_source") or [None] * len(completions))[row],
                              solution_str=completion, ground_truth=self._ground_truth(row, columns),
                              extra_info=(columns.get("extra_info") or [None] * len(completions))[row])
            out.append(score["score"] if isinstance(score, dict) else score)
        return out


def _trl_or_ours(obj, args, name: str):
    """An ORM class (ours, ms-swift's) is built with the run's arguments; a plain callable is TRL's."""
    if inspect.isclass(obj):
        return obj(args)
    return TRLReward(obj, name)


def _resolve(name: str, args):
    """One --reward_funcs entry → callable."""
    if name.endswith(".py"):
        return OpenRLHFReward(name)
    if name in orms:
        obj = orms.get(name)
        return obj(args) if inspect.isclass(obj) else obj
    path, colon, attr = name.rpartition(":")
    if colon and path.endswith(".py"):  # file.py:func
        module = import_file(path, "--reward_funcs")
        if not hasattr(module, attr):
            raise SwiftError(f"--reward_funcs {name}: {path} defines no {attr}")
        return _trl_or_ours(getattr(module, attr), args, attr)
    if colon:  # module:attr, ours (as before TRL's forms were read)
        obj = orms.get(name)
        return obj(args) if inspect.isclass(obj) else obj
    module, dot, attr = name.rpartition(".")
    if dot and module:  # TRL's dotted path: package.module.func
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise SwiftError(f"--reward_funcs {name}: cannot import it: {e}") from None
        return _trl_or_ours(obj, args, attr)
    return orms.get(name)  # a miss: one line with the registered names


def _conversations(completions: list[str], messages: list[list[dict]], prompt_messages) -> list[list[dict]]:
    """The conversations a reward model scores: `messages` as the manager hands it (the whole
    conversation, the answer last; `prompt_messages` given), or, called directly with the prompts
    alone (`swift sample`), each prompt with its completion appended."""
    if prompt_messages is not None:
        return [list(m) for m in messages]
    return [[*m, {"role": "assistant", "content": c}] for c, m in zip(completions, messages)]


def whole_conversations(completions: list[str], columns: dict[str, list]) -> dict[str, list]:
    """The columns as ms-swift's GRPO hands them to reward functions (the online trainer's, before the
    manager): `messages` the whole conversation with the answer last (`messages[-1]["content"]`), from
    `messages` (the prompts) and, for a multi-turn rollout, `trajectory_messages` (cut after its last
    assistant message); the prompts stay as `prompt_messages`. The trainer, `swift sample` and
    `swift attack` all hand reward functions these columns."""
    prompts = columns.get("messages")
    if prompts is None or "prompt_messages" in columns:
        return columns
    trajectories = columns.get("trajectory_messages") or [None] * len(completions)
    whole = []
    for prompt, trajectory, completion in zip(prompts, trajectories, completions):
        answers = [k for k, m in enumerate(trajectory or []) if k >= len(prompt) and m.get("role") == "assistant"]
        whole.append(list(trajectory[:answers[-1] + 1]) if answers else
                     [*prompt, {"role": "assistant", "content": completion}])
    return {**columns, "messages": whole, "prompt_messages": prompts}


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

    def __call__(self, completions, messages, prompt_messages=None, **kwargs):
        conversations = _conversations(completions, messages, prompt_messages)
        return self.scorer.score([self.scorer.render(m) for m in conversations])


class RemoteRewardModel:
    """`swift deploy --task_type seq_cls` (or any server with its `/v1/rewards` route)."""

    __name__ = "reward_model_url"

    def __init__(self, url: str, timeout: float = 60.0):
        self.url = url.rstrip("/")
        self.url = self.url if self.url.endswith("/v1/rewards") else self.url + "/v1/rewards"
        self.timeout = timeout

    def __call__(self, completions, messages, prompt_messages=None, **kwargs):
        body = {"messages": _conversations(completions, messages, prompt_messages)}
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return [float(r) for r in json.load(response)["rewards"]]
        except OSError as e:
            raise SwiftError(f"--reward_model_url {self.url}: {e}") from None


def build_reward_funcs(names: list[str], args=None, reward_model: str | None = None,
                       reward_model_url: str | None = None, process: bool = False,
                       extra: list[tuple[str, Callable]] = ()) -> list[tuple[str, Callable]]:
    """`process`: a process reward model (or an environment) scores too, so no outcome reward is
    needed. `extra`: rewards the run adds itself (an environment's), after the verl function."""
    funcs: list[tuple[str, Callable]] = []
    for name in names:
        func = _resolve(name, args)
        funcs.append((func.__name__ if isinstance(func, (OpenRLHFReward, TRLReward)) else name, func))
    verl_path = getattr(args, "custom_reward_function_path", None)
    if verl_path:
        func = VerlReward(verl_path, getattr(args, "custom_reward_function_name", None) or "compute_score")
        funcs.append((func.__name__, func))
    funcs += list(extra)
    if reward_model:
        funcs.append(("reward_model", RewardModelReward(reward_model, getattr(args, "template", None))))
    if reward_model_url:
        funcs.append(("reward_model_url", RemoteRewardModel(reward_model_url)))
    if not funcs and not process:
        raise SwiftError("online RL needs a reward: --reward_funcs, --custom_reward_function_path, --reward_model, "
                        "--reward_model_url or --prm_model")
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
        self.context: dict[str, Any] = {}  # what TRL hands its reward functions besides the data (trainer_state, ...)

    def _kwargs(self, func) -> dict[str, Any]:
        """TRL's functions get the whole context; the others (ms-swift's ORMs, ours) `trainer_state`,
        which ms-swift hands every reward function (None outside a trainer; before 2026-12-07 only
        TRL's functions got it)."""
        if isinstance(func, TRLReward):
            return self.context
        return {"trainer_state": self.context.get("trainer_state")}

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.funcs]

    def __call__(self, completions: list[str], columns: dict[str, list[Any]]) -> tuple[list[float], list[list[float]]]:
        """Return (weighted totals, per-function values with NaN for None) for every row."""
        per_func: list[list[float] | None] = [None] * len(self.funcs)
        pending = []
        for i, (name, func) in enumerate(self.funcs):
            try:
                result = func(completions, **columns, **self._kwargs(func))
            except Exception as e:  # a user's function failed: find and name the row
                self._raise(name, func, completions, columns, e)
            if inspect.isawaitable(result):  # async functions: awaited together below
                pending.append((i, name, func, result))
                continue
            per_func[i] = self._checked(name, completions, result)
        if pending:
            async def gather():
                return await asyncio.gather(*(r for *_, r in pending), return_exceptions=True)

            for (i, name, func, _), result in zip(pending, asyncio.run(gather())):
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
        values = [float("nan") if v is None else float(v) for v in result]
        for row, v in enumerate(values):  # NaN (as None): no reward; an infinite one would become ±3e38 advantages
            if math.isinf(v):
                raise SwiftError(f"reward function '{name}' returned {v} for row {row} of the batch (completion "
                                 f"{completions[row][:60]!r}): return a finite number, or None for no reward")
        return values

    def _raise(self, name, func, completions, columns, error: BaseException):
        """Re-run row by row to name the first failing row, then stop the run with one line."""
        for row in range(len(completions)):
            one = {k: v[row:row + 1] for k, v in columns.items()}
            try:
                result = func(completions[row:row + 1], **one, **self._kwargs(func))
                if inspect.isawaitable(result):
                    asyncio.run(result)
            except Exception as e:
                shown = ", ".join(f"{k}={v[row]!r}"[:80] for k, v in columns.items()
                                  if isinstance(v[row], (str, int, float, bool)) and k != "prompt_texts")
                raise SwiftError(f"reward function '{name}' failed on row {row} of the batch ({shown}; "
                                 f"completion {completions[row][:60]!r}): {type(e).__name__}: {e}") from None
        raise SwiftError(f"reward function '{name}' failed: {type(error).__name__}: {error}") from None

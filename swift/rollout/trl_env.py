"""TRL's `environment_factory` environments, run unchanged: `--environment_factory file.py:Class`.

An environment class (TRL 1.x's contract) has `reset(**row)`, which may return a string that is
appended to the last user message, and public methods with type hints and Google-style docstrings,
which become the tools of the prompt (their JSON schemas, as transformers' `get_json_schema` makes
them, rendered by the chat template). Each trajectory has an instance to itself, taken from a pool
(as TRL pools them) and reset for it; methods may be async (one event loop runs them). After every answer,
the `<tool_call>` blocks in it are parsed; each call runs the method with its arguments and its
result (or `{'error': ...}` when it raised, as TRL) is appended as a `tool` message; an answer
without a call ends the trajectory (as does the length limit or `--max_turns`). Tokens of tool
messages carry no loss. When the class defines `get_reward()`, its value at the end of the
trajectory is one more reward, named after the class (weight 1 unless `--reward_weights` says).
Reward functions also receive the trajectories' instances as `environments` (colocated runs).

Several environments: `--environment_factory NAME=file.py:Class ...`; each row's `environment`
column picks one (and is not passed to `reset`), as TRL's dict form.
"""
from __future__ import annotations

import inspect
import json
from typing import Any, Callable

from swift.plugin import load_attr, register
from swift.utils.event_loop import EventLoopThread
from swift.rollout.multi_turn import MultiTurnScheduler
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)
FLAG = "--environment_factory"
METHOD_TIMEOUT = 600  # seconds an async environment method may take (a server that stopped answering)


def load_factories(specs: list[str] | str) -> dict[str | None, Callable]:
    """One factory for every row ({None: f}), or NAME=path entries selected by the `environment` column."""
    specs = [specs] if isinstance(specs, str) else list(specs)
    named = [s for s in specs if "=" in s.split(":")[0]]
    if named and len(named) != len(specs) or not specs:
        raise SwiftError(f"{FLAG}: give one file.py:Class, or NAME=file.py:Class for every environment")
    if not named:
        if len(specs) > 1:
            raise SwiftError(f"{FLAG}: several environments need names: NAME=file.py:Class (a row's `environment` "
                             "column picks one)")
        return {None: load_attr(specs[0], FLAG, "Class")}
    return {name: load_attr(path, FLAG, "Class") for name, _, path in (s.partition("=") for s in specs)}


def methods_of(env) -> dict[str, Callable]:
    """The tools: public functions of the class (properties are not evaluated), not reset/get_reward."""
    return {name: getattr(env, name) for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")}


def schemas(env) -> list[dict]:
    from transformers.utils import get_json_schema

    out = []
    for name, method in methods_of(env).items():
        try:
            out.append(get_json_schema(method))
        except Exception as e:  # transformers' DocstringParsingException / TypeHintParsingException
            raise SwiftError(f"{FLAG}: {type(env).__name__}.{name} cannot be a tool (it needs type hints and a "
                             f"Google-style docstring): {e}") from None
    return out


@register("multi_turn", "trl_environment")
class EnvironmentScheduler(MultiTurnScheduler):
    def __init__(self, max_turns: int | None = None, *args, environment_factory=None, **kwargs):
        super().__init__(max_turns)
        if not environment_factory:
            raise SwiftError(f"--multi_turn_scheduler trl_environment needs {FLAG}")
        self.factories = load_factories(environment_factory)
        self.tools: dict[str | None, list[dict]] = {}
        self.rewarded: dict[str | None, bool] = {}
        self._loop = EventLoopThread()
        self._idle: dict[str | None, list] = {name: [] for name in self.factories}  # instances to reuse
        for name, factory in self.factories.items():  # probe one of each: reset, tools, reward
            probe = factory()
            if not callable(getattr(probe, "reset", None)):
                raise SwiftError(f"{FLAG}: {type(probe).__name__} defines no reset method")
            self.tools[name] = schemas(probe)
            self.rewarded[name] = callable(getattr(probe, "get_reward", None))
            self._idle[name].append(probe)
        self._envs: dict[str, tuple[str | None, Any]] = {}

    def reward_names(self) -> list[str]:
        """One reward per environment class that defines get_reward (TRL: named after the class)."""
        names = []
        for name, factory in self.factories.items():
            cls_name = factory.__name__ if inspect.isclass(factory) else type(factory()).__name__
            if self.rewarded[name] and cls_name not in names:
                names.append(cls_name)
        return names

    def _pick(self, data_dict: dict) -> tuple[str | None, dict]:
        if None in self.factories:
            return None, dict(data_dict)
        name = data_dict.get("environment")
        if name not in self.factories:
            raise SwiftError(f"{FLAG}: the row's environment {name!r} is none of {', '.join(self.factories)}")
        return name, {k: v for k, v in data_dict.items() if k != "environment"}

    def _reset(self, infer_request):
        """An instance of the row's environment (a pooled one, as TRL reuses them), reset to the row."""
        name, row = self._pick(infer_request.data_dict)
        env = self._idle[name].pop() if self._idle[name] else self.factories[name]()
        row.setdefault("prompt", [dict(m) for m in infer_request.messages])  # TRL passes the example's own
        try:
            observation = self._loop.run(env.reset(**row), METHOD_TIMEOUT)
        except TimeoutError:  # an instance that stopped answering is not reused
            raise
        except BaseException:
            self._idle[name].append(env)
            raise
        return name, env, observation

    def check_request(self, infer_request) -> None:
        name, env, _ = self._reset(infer_request)  # a row the environment cannot start from is dropped
        self._idle[name].append(env)

    def start(self, infer_request) -> None:
        name, env, observation = self._reset(infer_request)
        self._envs[infer_request.uid] = name, env
        if observation is not None:
            last = infer_request.messages[-1]
            infer_request.messages[-1] = {**last, "content": last["content"] + str(observation)}
        infer_request.tools = self.tools[name] or None
        infer_request.rollout_infos["environments"] = env

    @staticmethod
    def _calls(infer_request) -> list[dict]:
        from swift.deploy.tools import parse_tool_calls

        return parse_tool_calls(infer_request.messages[-1]["content"] or "")[1]

    def check_finished(self, infer_request, response_choice, current_turn) -> bool:
        if response_choice.finish_reason == "length" or not self._calls(infer_request):
            return True
        return bool(self.max_turns) and current_turn >= self.max_turns

    def step(self, infer_request, response_choice, current_turn):
        env = self._envs[infer_request.uid][1]
        tools = methods_of(env)
        for call in self._calls(infer_request):
            name = call["function"]["name"]
            try:
                if name not in tools:
                    raise ValueError(f"Tool {name} not found.")
                result = self._loop.run(tools[name](**json.loads(call["function"]["arguments"])), METHOD_TIMEOUT)
            except Exception as e:  # the model's bad call is the environment's answer, as in TRL
                result = {"error": str(e)}
            infer_request.messages.append({"role": "tool", "name": name, "content": str(result)})
        return {"infer_request": infer_request}

    def finish(self, infer_request) -> None:
        _, env = self._envs.get(infer_request.uid, (None, None))
        if env is not None and callable(getattr(env, "get_reward", None)):
            reward = float(self._loop.run(env.get_reward(), METHOD_TIMEOUT))
            infer_request.rollout_infos[f"environment_reward/{type(env).__name__}"] = reward

    def release(self, infer_request) -> None:
        """The trajectory's instance goes back to the pool (reset again before its next trajectory)."""
        name, env = self._envs.pop(infer_request.uid, (None, None))
        if env is not None:
            self._idle[name].append(env)


class EnvironmentReward:
    """The reward an environment class's get_reward gave each trajectory (None for other classes')."""

    def __init__(self, cls_name: str):
        self.key = f"environment_reward/{cls_name}"
        self.__name__ = cls_name

    def __call__(self, completions, **columns):
        return columns.get(self.key) or [None] * len(completions)


def environment_rewards(scheduler) -> list[tuple[str, EnvironmentReward]]:
    """The rewards of a run's environments (none for other schedulers)."""
    if not isinstance(scheduler, EnvironmentScheduler):
        return []
    return [(name, EnvironmentReward(name)) for name in scheduler.reward_names()]

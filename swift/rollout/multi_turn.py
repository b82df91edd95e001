"""Multi-turn rollouts. ms-swift plugin files load as they are (`response_choice` is our `Choice`:
its `.text`, not ms-swift's `.message.content`):

    from swift.rollout.multi_turn import MultiTurnScheduler, multi_turns

    class MyScheduler(MultiTurnScheduler):
        def check_finished(self, infer_request, response_choice, current_turn) -> bool: ...
        def step(self, infer_request, response_choice, current_turn) -> dict: ...

    multi_turns['my_scheduler'] = MyScheduler

After each generated turn the rollout appends the answer to `infer_request.messages`, asks
`check_finished`, and otherwise calls `step`, which returns `{"infer_request": ...}` with the
messages for the next turn (e.g. a tool or environment reply, or an edited assistant message),
and may add ms-swift's `rollout_infos` and `response_token_ids` / `response_loss_mask`
(`swift.rollout.runner._step_result`). Tokens the model generated carry loss (under `--loss_scale
last_round` those of the final assistant message alone); tokens the environment added carry none. A scheduler that
keeps state per trajectory keys it by `infer_request.uid` and forgets it in `release`, which the
rollout calls once per trajectory however it ended (finished, out of budget, or an error).
"""
from __future__ import annotations

import inspect
import uuid
from dataclasses import dataclass, field
from typing import Any

from swift.rewards.builtin import is_correct
from swift.utils.event_loop import EventLoopThread
from swift.utils.registry import Registry, SwiftError
from swift.plugin import register


@dataclass
class RolloutInferRequest:
    """One trajectory in progress: its conversation and its dataset row (`data_dict`)."""

    messages: list[dict]
    data_dict: dict[str, Any] = field(default_factory=dict)
    rollout_infos: dict[str, Any] = field(default_factory=dict)  # passed to reward functions by name
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)  # this trajectory's identity
    tools: list | None = None  # tool signatures the template renders into the prompt (a scheduler's)


class MultiTurnScheduler:
    """ms-swift's constructor: `(infer_engine=None, max_turns=None, *args, **kwargs)`, so a plugin's
    `super().__init__(infer_engine, max_turns, ...)` keeps its `max_turns` (before 2026-12-07 ours took
    `max_turns` first and such a plugin lost it; an int given first is still read as `max_turns`).
    `infer_engine` and `tokenizer` are None here: the rollout calls the engine and renders the
    template, not the scheduler (a `tokenizer` keyword or an engine that has one sets `tokenizer`)."""

    def __init__(self, infer_engine=None, max_turns: int | None = None, *args, **kwargs):
        if isinstance(infer_engine, int) and not isinstance(infer_engine, bool) and max_turns is None:
            infer_engine, max_turns = None, infer_engine  # a subclass written for the old order
        self.infer_engine = infer_engine
        self.tokenizer = kwargs.get("tokenizer") or getattr(infer_engine, "tokenizer", None)
        self.max_turns = max_turns

    def check_finished(self, infer_request: RolloutInferRequest, response_choice, current_turn: int) -> bool:
        """Stop when the answer was cut off by the length limit, or after `--max_turns` turns."""
        if response_choice.finish_reason == "length":
            return True
        return bool(self.max_turns) and current_turn >= self.max_turns

    def step(self, infer_request: RolloutInferRequest, response_choice, current_turn: int) -> dict:
        return {"infer_request": infer_request}

    def start(self, infer_request: RolloutInferRequest) -> None:
        """Prepare a trajectory before its first turn (e.g. an environment's first observation, tools)."""

    def finish(self, infer_request: RolloutInferRequest) -> None:
        """After its last turn, however it ended: a last chance to set `rollout_infos` (e.g. a reward)."""

    def release(self, infer_request: RolloutInferRequest) -> None:
        """Forget what was kept for this trajectory (called once, when its rollout ends)."""

    def check_request(self, infer_request: RolloutInferRequest) -> None:
        """Refuse (SwiftError) a request this scheduler cannot run, before anything is generated."""


multi_turns: Registry[type] = Registry("multi-turn scheduler")


@register("multi_turn", "math_tip_trick")
class MathTipTrick(MultiTurnScheduler):
    """A wrong answer gets one more try: the answer is cut before `<answer>`/`</think>`, a hint is
    appended to the same assistant message, and the model continues from there."""

    tip = "The answer is not correct, it seems you made a mistake; let me recheck very carefully."

    def check_finished(self, infer_request, response_choice, current_turn):
        last = infer_request.messages[-1]["content"]
        if self.tip in last:  # the tip is given once
            return True
        if is_correct(last, infer_request.data_dict.get("solution", "")) == 1.0:
            return True
        return super().check_finished(infer_request, response_choice, current_turn)

    def step(self, infer_request, response_choice, current_turn):
        answer = infer_request.messages[-1]["content"]
        for marker in ("<answer>", "</think>"):
            if marker in answer:
                answer = answer[:answer.index(marker)]
        infer_request.messages[-1] = {"role": "assistant", "content": answer + self.tip}
        return {"infer_request": infer_request}


# -- gym-style environments ----------------------------------------------------------------------
class Env:
    """A gym-style text environment: `reset(data_dict) -> observation`, `step(action) -> (observation,
    reward, done, info)`."""

    def reset(self, data_dict: dict) -> str:
        raise NotImplementedError(f"{type(self).__name__} must define reset")

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        raise NotImplementedError(f"{type(self).__name__} must define step")


envs: Registry[type] = Registry("environment")


@register("env", "guess_number")
class GuessNumber(Env):
    """Guess the row's `solution` (an integer); the environment answers 'higher' or 'lower'.
    Reward 1 for a right guess, 0 otherwise."""

    def reset(self, data_dict):
        self.target = int(str(data_dict["solution"]).strip())
        return ""

    def step(self, action):
        digits = "".join(ch for ch in action if ch.isdigit() or ch == "-")
        try:
            guess = int(digits)
        except ValueError:
            return "Answer with a number.", 0.0, False, {}
        if guess == self.target:
            return "", 1.0, True, {}
        return ("higher" if guess < self.target else "lower"), 0.0, False, {}


@register("multi_turn", "gym")
class GymScheduler(MultiTurnScheduler):
    """Runs the environment named by the row's `env` column (or `--gym_env`): each answer is an
    action, each observation becomes the next user message; the summed environment reward is handed
    to reward functions as the `gym_reward` column (see the `gym_reward` reward)."""

    def __init__(self, infer_engine=None, max_turns=None, *args, env: str | None = None, **kwargs):
        super().__init__(infer_engine, max_turns, *args, **kwargs)
        self.default_env = env
        self._envs: dict[int, tuple[Env, list]] = {}

    def _env_class(self, request) -> type:
        """The row's `env` names a registered environment only (rows are data: they never pick code
        to import); `--gym_env`, given by whoever starts the run, may also be a module:Class path."""
        name = request.data_dict.get("env")
        if name is not None:
            if not isinstance(name, str) or name not in envs:
                raise SwiftError(f"env {name!r} is not a registered environment (registered: "
                                 f"{', '.join(sorted(envs))}); register others in an --external_plugins file")
            return envs.get(name)
        if not self.default_env:
            raise SwiftError("the gym scheduler needs an 'env' column or --gym_env")
        return envs.get(self.default_env)

    def check_request(self, infer_request):
        """The environment must start from the row: its `reset` runs here, before anything is
        generated, and what it raises becomes one line about the row."""
        cls = self._env_class(infer_request)
        try:
            cls().reset(infer_request.data_dict)
        except SwiftError:
            raise
        except Exception as e:
            raise SwiftError(f"environment {cls.__name__} cannot start from this row: {type(e).__name__}: {e}") \
                from None

    def _env(self, request):
        key = request.uid
        if key not in self._envs:
            env = self._env_class(request)()
            env.reset(request.data_dict)
            self._envs[key] = (env, [])
            request.rollout_infos["gym_reward"] = 0.0
        return self._envs[key]

    def check_finished(self, infer_request, response_choice, current_turn):
        env, _ = self._env(infer_request)
        observation, reward, done, _info = env.step(infer_request.messages[-1]["content"])
        infer_request.rollout_infos["gym_reward"] += reward
        infer_request.rollout_infos["_observation"] = observation
        return done or super().check_finished(infer_request, response_choice, current_turn)

    def release(self, infer_request):
        self._envs.pop(infer_request.uid, None)

    def step(self, infer_request, response_choice, current_turn):
        observation = infer_request.rollout_infos.pop("_observation", "")
        infer_request.messages.append({"role": "user", "content": observation})
        return {"infer_request": infer_request}


AGENT_TIMEOUT = 600  # seconds an agent's reset or step may take (a server that stopped answering)


@dataclass
class _Agent:
    """One trajectory's AgentInstance and what OpenRLHF's executor keeps beside it."""

    instance: Any
    label: Any
    text: str  # OpenRLHF's observation_text: the observation, then each answer and its feedback
    reward: float = 0.0  # the step rewards summed


def _number(value) -> float:
    return float(value.item() if hasattr(value, "item") else value)


class AgentInstanceScheduler(MultiTurnScheduler):
    """Runs an OpenRLHF `AgentInstance` file as OpenRLHF's `MultiTurnAgentExecutor` does
    (openrlhf/utils/agent.py), one instance per trajectory. Before the first turn `reset({"observation":
    prompt, "label": label})` (the prompt: its messages' text, one per line; the label: the row's
    `solution`, else `label`) returns `{"observation": ...}`, which the model answers: the prompt as it
    was when unchanged, the prompt with its last message extended when the observation extends it, else
    the observation alone as the one user message. After each answer `step({"observation_text": the
    text so far, "action_text": the answer, "label": label})` returns `environment_feedback` (the next
    user message), `done` and `rewards`. The rewards summed over the steps reach reward functions as
    `agent_reward` (OpenRLHF's reward; before 2026-12-07 the last step's alone), and `scores` (the last
    step's, else that sum: what OpenRLHF's dynamic filtering reads) as `agent_score`. Async methods run
    on one event loop of the scheduler's own, so what an agent opens in `reset` (a client session) is
    still usable in `step` (before 2026-12-07 each call had a loop of its own)."""

    def __init__(self, agent_cls, max_turns=None, *args, **kwargs):
        super().__init__(None, max_turns, *args, **kwargs)
        self.agent_cls = agent_cls
        self._agents: dict[str, _Agent] = {}
        self._loop = EventLoopThread()

    def start(self, infer_request):
        data = infer_request.data_dict
        label = data.get("solution", data.get("label"))
        prompt = "\n".join(str(m["content"]) for m in infer_request.messages)
        instance = self.agent_cls.__new__(self.agent_cls)  # OpenRLHF's AgentInstanceBase has `async def __init__`
        made = self.agent_cls.__init__(instance)
        if inspect.isawaitable(made):
            self._loop.run(made, AGENT_TIMEOUT)
        result = self._loop.run(instance.reset({"observation": prompt, "label": label}), AGENT_TIMEOUT)
        if not (isinstance(result, dict) and isinstance(result.get("observation"), str)):
            raise SwiftError(f"{type(instance).__name__}.reset returned {type(result).__name__}; it must return "
                             "{'observation': text} (OpenRLHF's AgentInstanceBase returns the states it is given)")
        observation = result["observation"]
        if observation != prompt:
            if observation.startswith(prompt) and infer_request.messages:
                last = infer_request.messages[-1]
                infer_request.messages[-1] = {**last, "content": last["content"] + observation[len(prompt):]}
            else:
                infer_request.messages[:] = [{"role": "user", "content": observation}]
        self._agents[infer_request.uid] = _Agent(instance, label, observation)

    def check_finished(self, infer_request, response_choice, current_turn):
        agent = self._agents[infer_request.uid]
        action = response_choice.text
        result = self._loop.run(agent.instance.step(
            {"observation_text": agent.text, "action_text": action, "label": agent.label}), AGENT_TIMEOUT)
        feedback = result.get("environment_feedback", "")
        agent.text += action + feedback
        agent.reward += _number(result.get("rewards", 0.0))
        infos = infer_request.rollout_infos
        infos["agent_reward"] = agent.reward
        infos["agent_score"] = _number(result["scores"]) if result.get("scores") is not None else agent.reward
        infos["_feedback"] = feedback
        return bool(result.get("done")) or super().check_finished(infer_request, response_choice, current_turn)

    def release(self, infer_request):
        self._agents.pop(infer_request.uid, None)

    def step(self, infer_request, response_choice, current_turn):
        infer_request.messages.append({"role": "user", "content": infer_request.rollout_infos.pop("_feedback", "")})
        return {"infer_request": infer_request}


def scheduler_class(name: str) -> type:
    """The class `build_scheduler` builds for `name` (without importing an AgentInstance file)."""
    return AgentInstanceScheduler if name.endswith(".py") else multi_turns.get(name)


def refuse_unread_env(name: str | None, env: str | None, given_as: str | None = None) -> None:
    """`--gym_env` names the gym scheduler's environment: refused with a scheduler that does not take it
    (before 2026-12-07 it was dropped without a word). A scheduler takes it when it is the gym
    scheduler (or a subclass) or its constructor has an `env` parameter."""
    if not env or not name:
        return
    cls = scheduler_class(name)
    if inspect.isclass(cls) and issubclass(cls, GymScheduler) or "env" in inspect.signature(cls).parameters:
        return
    raise SwiftError(f"--gym_env names the environment of --multi_turn_scheduler gym; "
                     f"{given_as or f'--multi_turn_scheduler {name}'} does not read it: drop --gym_env")


def build_scheduler(name: str | None, max_turns: int | None, **kwargs) -> MultiTurnScheduler | None:
    """A registered name, a `module:Class` path, or a `.py` file defining `AgentInstance` (OpenRLHF)."""
    if not name:
        return None
    refuse_unread_env(name, kwargs.get("env"))
    if name.endswith(".py"):
        from swift.plugin import import_file

        module = import_file(name, "--multi_turn_scheduler")
        if not hasattr(module, "AgentInstance"):
            raise SwiftError(f"--multi_turn_scheduler {name}: the file defines no AgentInstance class")
        return AgentInstanceScheduler(module.AgentInstance, max_turns)
    cls = multi_turns.get(name)
    accepted = inspect.signature(cls.__init__).parameters
    extra = {k: v for k, v in kwargs.items() if k in accepted or any(
        p.kind is p.VAR_KEYWORD for p in accepted.values())}
    return cls(max_turns=max_turns, **extra)


from swift.rollout import trl_env  # noqa: E402,F401  (registers the trl_environment scheduler)

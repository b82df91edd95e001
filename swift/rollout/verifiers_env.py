"""prime-rl `verifiers` environments, run by their own rollout loop with our engine as the model.

The classic environment API (verifiers 0.3.x, where `import verifiers` is `verifiers.legacy`; 0.2.x
at the top level): `load_environment(**kwargs)` returns an Environment bundling a dataset, a rubric
(weighted reward functions) and a rollout protocol (`SingleTurnEnv`, `MultiTurnEnv.env_response`
with its stop conditions, `ToolEnv`'s tools).

- `--dataset verifiers:<env>[?key=value&...][:train|eval][#N]`: `<env>` is an installed environment
  module (what `verifiers.load_environment` imports) or a `path/to/env.py` file; the query gives
  `load_environment`'s keyword arguments (values read as YAML). The rows are the environment's
  dataset (eval: its eval dataset): the prompt it formats (system prompt included) is the
  conversation, `answer` is also `solution`, and the row itself travels as `verifiers_input`.
- Online RL on such rows (`swift rlhf --rlhf_type grpo|ppo`) runs each trajectory through the
  environment's own `rollout`: every model call it makes is answered by our engine (batched across
  the trajectories waiting at that moment), with the environment's tools rendered by our template
  and `<tool_call>` blocks handed back as tool calls. Tokens the model generated carry loss; what
  the environment added carries none. Then the rubric scores each prompt's group
  (`score_group`); `--reward_funcs verifiers` is its weighted total.
- `--max_completion_length` bounds every token after the prompt (as for our multi-turn rollouts):
  a model call with no budget left ends the trajectory as an overlong prompt does in verifiers.
"""
from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from dataclasses import replace
from typing import Iterator

from swift.plugin import import_file, register
from swift.rewards.base import ORM
from swift.utils.event_loop import EventLoopThread
from swift.utils.logging import get_logger
from swift.utils.query import query_args
from swift.utils.registry import SwiftError

logger = get_logger(__name__)
PREFIX = "verifiers:"
_LOOP = EventLoopThread()


def _vf():
    try:
        import verifiers as vf
    except ImportError:
        raise SwiftError('verifiers environments need the verifiers package: pip install -e ".[gym]"') from None
    if not hasattr(vf, "MultiTurnEnv"):  # 0.4 replaced it with tasksets and agent harnesses
        raise SwiftError(f"verifiers {getattr(vf, '__version__', '?')} has no classic environment API "
                         "(load_environment(**kwargs) with a dataset and a rubric); this loader reads verifiers 0.3.x "
                         '(pip install -e ".[gym]")')
    return vf


def parse_spec(spec: str) -> tuple[str, dict]:
    """`verifiers:my_env?n=4&kind=multi` → ("my_env", {"n": 4, "kind": "multi"})."""
    env_id, _, query = spec[len(PREFIX):].partition("?")
    kwargs = query_args(spec, query)
    if not env_id:
        raise SwiftError(f"--dataset {spec}: name the environment (verifiers:<module> or verifiers:path/env.py)")
    return env_id, kwargs


@functools.lru_cache(maxsize=None)
def load_env(spec: str):
    """The environment a `verifiers:` spec names (loaded once per process)."""
    env_id, kwargs = parse_spec(spec)
    vf = _vf()
    try:
        if env_id.endswith(".py"):
            module = import_file(env_id, "--dataset")
            if not callable(getattr(module, "load_environment", None)):
                raise SwiftError(f"--dataset {spec}: {env_id} defines no load_environment(**kwargs)")
            return module.load_environment(**kwargs)
        return vf.load_environment(env_id, **kwargs)
    except SwiftError:
        raise
    except Exception as e:
        raise SwiftError(f"--dataset {spec}: loading the environment failed: {type(e).__name__}: {e}") from None


def _plain(message) -> dict:
    """A verifiers message (pydantic or dict) as our chat message."""
    m = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
    content = m.get("content")
    if isinstance(content, list):  # content parts: their text
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    out = {"role": m["role"], "content": "" if content is None else str(content)}
    if m["role"] == "assistant" and not out["content"] and m.get("tool_calls"):  # a call given as data only
        out["content"] = "".join(f'<tool_call>\n{{"name": {json.dumps(c["name"])}, "arguments": {c["arguments"]}}}'
                                 f'\n</tool_call>' for c in m["tool_calls"])
    return out


def iter_rows(source: str, split: str, n: int | None) -> Iterator[tuple[str, dict]]:
    env = load_env(source)
    try:
        data = env.get_dataset() if split == "train" else env.get_eval_dataset()
    except ValueError as e:  # verifiers: "dataset is not set"
        raise SwiftError(f"--dataset {source}:{split}: {e}") from None
    if n is not None and n > len(data):
        raise SwiftError(f"--dataset {source}:{split}#{n}: the environment's {split} dataset has only {len(data)} rows")
    for i in range(len(data) if n is None else n):
        row = data[i]
        messages = [_plain(m) for m in (row["prompt"] if isinstance(row["prompt"], list)
                                        else [{"role": "user", "content": row["prompt"]}])]
        out = {"messages": messages, "verifiers_env": source, "verifiers_input": json.dumps(row, default=str)}
        if row.get("answer") not in (None, ""):
            out["solution"] = str(row["answer"])
        yield f"{source}:{split} row {i + 1}", out


class _Batcher:
    """Model calls of concurrent rollouts, answered together by one engine call (run off the event
    loop, so an engine whose `infer` runs its own loop works, and environments' I/O goes on)."""

    def __init__(self, engine, config, adapter: str | None = None):
        self.engine, self.config, self.adapter, self.pending = engine, config, adapter, []

    def submit(self, ids: list[int], max_tokens: int, seed: int | None) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((ids, max_tokens, seed, future))
        return future

    def _infer(self, batch: list) -> list:
        from swift.infer.protocol import InferRequest

        responses = self.engine.infer([InferRequest(input_ids=ids, adapter=self.adapter) for ids, *_ in batch],
                                      [replace(self.config, n=1, max_tokens=min(self.config.max_tokens, m), seed=s)
                                       for _, m, s, _ in batch])
        if len(responses) != len(batch):
            raise SwiftError(f"the engine answered {len(responses)} of {len(batch)} requests")
        return responses

    async def flush(self) -> None:
        batch, self.pending = [b for b in self.pending if not b[3].done()], []  # a timed-out rollout's call is gone
        if not batch:
            return
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(None, self._infer, batch)
        except Exception:  # noqa: BLE001 - one request's fault fails only that one: each alone
            results = []
            for item in batch:
                try:
                    results += await loop.run_in_executor(None, self._infer, [item])
                except Exception as e:  # noqa: BLE001 - its rollout records the error
                    results.append(e)
        for (*_, future), result in zip(batch, results):
            if future.done():
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            elif not result.choices:
                future.set_exception(SwiftError("the engine returned no answer"))
            else:
                future.set_result(result.choices[0])


class VerifiersRollout:
    """Trajectories of `verifiers:` rows, for `Rollout.generate_with_current_weights`."""

    def __init__(self, engine, template, config, max_completion_length: int, adapter: str | None = None):
        from swift.rollout.runner import _logprobs

        self.engine, self.template, self.config, self.adapter = engine, template, config, adapter
        self.context = getattr(engine, "max_model_len", None)  # the engine's context, where it has one
        self.max_completion_length = max_completion_length
        self.logprobs_of = _logprobs
        self.calls: dict[str, list[tuple[list[int], list[int], list[float]]]] = {}
        self.index: dict[str, int] = {}  # each trajectory's number, in the order of their first model calls

    def __call__(self, requests, n: int):
        from swift.rollout.runner import Trajectory

        vf = _vf()
        batcher = _Batcher(self.engine, self.config, self.adapter)
        client = _engine_client(vf)(self, batcher)
        jobs = [(r, load_env(r.data_dict["verifiers_env"]), json.loads(r.data_dict["verifiers_input"]))
                for r in requests]

        async def rollout_all():
            tasks = [asyncio.ensure_future(env.rollout(dict(row), client, "swift", {}))
                     for _, env, row in jobs for _ in range(n)]
            while not all(t.done() for t in tasks):
                waiting = len(batcher.pending)
                await asyncio.wait([t for t in tasks if not t.done()], timeout=0.005)
                running = sum(not t.done() for t in tasks)
                # every unfinished rollout waits on the model, or none joined the batch in the last wait
                if batcher.pending and (len(batcher.pending) >= running or len(batcher.pending) == waiting):
                    await batcher.flush()
            states = [asyncio.CancelledError() if t.cancelled() else t.exception() or t.result() for t in tasks]
            for k, (_, env, _) in enumerate(jobs):  # as verifiers: each prompt's group scored together, then cleanup
                group = [s for s in states[k * n:(k + 1) * n] if not isinstance(s, BaseException)]
                if not group:
                    continue
                try:
                    await (env.rubric.score_group if env.score_rollouts else env.rubric.dummy_score_group)(group)
                    for state in group:
                        await env.rubric.cleanup(state)
                except Exception as e:  # noqa: BLE001 - this group gets no reward; the others go on
                    logger.error(f"verifiers environment {jobs[k][0].data_dict['verifiers_env']}: its rubric failed "
                                 f"on a group: {type(e).__name__}: {e}")
                    for state in group:
                        state["error"], state["reward"] = e, None
            return states

        states = _LOOP.run(rollout_all(), timeout=None)  # one loop for every step: environments keep their clients
        self.index.clear()
        out = []
        for k, state in enumerate(states):
            request = requests[k // n]
            if isinstance(state, BaseException):
                logger.error(f"verifiers environment {request.data_dict['verifiers_env']} failed on a trajectory: "
                             f"{type(state).__name__}: {state}")
                prompt = self.template.encode_continuation(request.messages)
                out.append(Trajectory(prompt, [], [], "", True, list(request.messages),
                                      {**request.rollout_infos, "rollout_error": type(state).__name__}))
                continue
            try:
                out.append(self._trajectory(request, state, Trajectory))
            except SwiftError as e:  # this trajectory's tokens cannot be laid out; it alone is left out
                logger.error(str(e))
                prompt = self.template.encode_continuation(request.messages)
                out.append(Trajectory(prompt, [], [], "", True, list(request.messages),
                                      {**request.rollout_infos, "rollout_error": "SwiftError"}))
        return out

    def _trajectory(self, request, state, Trajectory):
        """Tokens as the model saw and wrote them: each call's prompt extends the previous one's
        tokens with what the environment added (no loss), then the tokens generated (loss)."""
        from swift.rollout.runner import continued

        calls = self.calls.pop(state["trajectory_id"], [])
        ids = calls[0][0] if calls else self.template.encode_continuation(request.messages)
        prompt_len, mask, lps = len(ids), [], []
        for k, (before, generated, logprobs) in enumerate(calls):
            if k:
                mask, lps = continued(ids, before, prompt_len, mask, lps,
                                      f"verifiers environment {request.data_dict['verifiers_env']}")
                ids = before
            ids, mask, lps = ids + generated, mask + [1] * len(generated), lps + logprobs
        completion = [_plain(m) for m in state.get("completion") or []]
        text = next((m["content"] for m in reversed(completion) if m["role"] == "assistant"), "")
        metrics = {f"verifiers/{k}": float(v) for k, v in (state.get("metrics") or {}).items()}
        reward, error = state.get("reward"), state.get("error")
        infos = {**request.rollout_infos, **metrics,
                 "verifiers_reward": None if reward is None or error else float(reward)}
        if error:  # verifiers recorded an error (the model call, a tool, the rubric): no reward from any function
            infos["rollout_error"] = type(error).__name__
            logger.error(f"verifiers environment {request.data_dict['verifiers_env']}: a trajectory ended with "
                         f"{type(error).__name__}: {error}")
        return Trajectory(ids[:prompt_len], ids[prompt_len:], mask, text,
                          bool(state.get("is_truncated") or state.get("timed_out")),
                          [*request.messages, *completion], infos,
                          turns=len(calls), logprobs=lps if self.config.logprobs else None)


@functools.lru_cache(maxsize=1)
def _engine_client(vf):
    """verifiers' Client answering model calls with our engine (a class made once verifiers is imported)."""
    from verifiers.legacy.types import Response, ResponseMessage, ToolCall, Usage

    from swift.deploy.tools import parse_tool_calls

    class EngineClient(vf.Client):
        def __init__(self, rollout: VerifiersRollout, batcher: _Batcher):
            super().__init__(object())
            self.rollout, self.batcher = rollout, batcher

        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool) -> dict:
            return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                     "parameters": tool.parameters}}

        async def to_native_prompt(self, messages) -> tuple[list[dict], dict]:
            return [_plain(m) for m in messages], {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            state, r = kwargs["state"], self.rollout
            calls = r.calls.setdefault(state["trajectory_id"], [])
            ids = r.template.encode_continuation(prompt, tools)
            start = len(calls[0][0]) if calls else len(ids)
            budget = r.max_completion_length - (len(ids) - start)
            if r.context is not None:  # and no call runs past the engine's context
                budget = min(budget, r.context - len(ids))
            if budget <= 0:
                raise vf.OverlongPromptError(f"no room left within --max_completion_length {r.max_completion_length} "
                                             "or the engine's context")
            index, seed = r.index.setdefault(state["trajectory_id"], len(r.index)), r.config.seed
            seed = None if seed is None else (seed + index * 7919 + len(calls) * 104729) % 2 ** 31
            choice = await self.batcher.submit(ids, budget, seed)
            generated = choice.sampled_token_ids()
            calls.append((ids, generated, r.logprobs_of(choice) if r.config.logprobs else []))
            return choice, len(ids)

        async def raise_from_native_response(self, response) -> None:
            return None

        async def from_native_response(self, response):
            choice, prompt_tokens = response
            _, calls = parse_tool_calls(choice.text)
            finish = "length" if choice.finish_reason == "length" else "tool_calls" if calls else "stop"
            completion_tokens = len(choice.sampled_token_ids())
            return Response(
                id=uuid.uuid4().hex, created=int(time.time()), model="swift",
                usage=Usage(prompt_tokens=prompt_tokens, reasoning_tokens=0, completion_tokens=completion_tokens,
                            total_tokens=prompt_tokens + completion_tokens),
                message=ResponseMessage(  # the raw text stays the content: re-rendered, it gives the same tokens
                    content=choice.text, finish_reason=finish, is_truncated=finish == "length",
                    tool_calls=[ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                                for c in calls] or None))

        async def close(self) -> None:
            return None

    return EngineClient


@register("reward", "verifiers")
class VerifiersReward(ORM):
    """The environment's rubric: the weighted total it gave each trajectory (None where the rollout
    failed or the row is not from a `verifiers:` dataset)."""

    def __call__(self, completions, verifiers_reward=None, **kwargs) -> list[float | None]:
        if verifiers_reward is None:
            raise SwiftError("the verifiers reward needs rows from --dataset verifiers:<env> (their rollout is scored "
                             "by the environment's rubric)")
        return list(verifiers_reward)


def uses_verifiers(requests) -> bool:
    """Whether these rows run through their verifiers environment (all of them or none)."""
    marked = [bool(r.data_dict.get("verifiers_env")) for r in requests]
    if any(marked) and not all(marked):
        raise SwiftError("a batch mixes verifiers:<env> rows with other rows; train on one kind at a time")
    return bool(marked) and marked[0]


"""Turn prompts into trajectories with any InferEngine: one request with n samples per prompt for
single-turn rollouts (the engine shares the prompt's prefill), or turn-by-turn with a scheduler."""
from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from swift.infer.protocol import InferEngine, InferRequest, RequestConfig
from swift.rollout.multi_turn import MultiTurnScheduler, RolloutInferRequest
from swift.serving.jobs import JobControl
from swift.template.base import Template
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)


@dataclass
class Trajectory:
    prompt_ids: list[int]
    completion_ids: list[int]  # every token after the prompt, generated or added by the environment
    loss_mask: list[int]  # 1 where the model generated the token
    text: str  # the final assistant message (what reward functions judge)
    truncated: bool  # the last turn hit the length limit
    messages: list[dict]  # the whole conversation
    rollout_infos: dict[str, Any] = field(default_factory=dict)
    turns: int = 1
    # the sampler's log-prob of each completion token when asked for (NaN where unknown: an appended
    # end token, environment tokens); an off-policy trainer's importance weights come from these
    logprobs: list[float] | None = None
    # where the final assistant message's tokens start in completion_ids (a scheduler that continues
    # one message, as math_tip_trick does, keeps one message over several turns): `--loss_scale
    # last_round` trains from here on
    last_round: int = 0


def _logprobs(choice) -> list[float]:
    """The sampler's log-prob of each sampled token, the end token's included (NaN where unknown)."""
    values = [lp.logprob for lp in choice.logprobs or []]
    if choice.stop_token_id is not None:
        values.append(float("nan") if choice.stop_logprob is None else choice.stop_logprob)
    return values + [float("nan")] * (len(choice.sampled_token_ids()) - len(values))


def _infer(engine: InferEngine, requests: list[InferRequest], config, control: JobControl | None):
    """engine.infer, under the job's deadline and cancel flag when it has them."""
    if control is None:
        return engine.infer(requests, config)
    return engine.infer(requests, config, control=control)


def single_turn(engine: InferEngine, template: Template, requests: list[RolloutInferRequest], config: RequestConfig,
                n: int, control: JobControl | None = None) -> list[Trajectory]:
    prompts = [template.encode_continuation(r.messages) for r in requests]
    responses = _infer(engine, [InferRequest(input_ids=p) for p in prompts], replace(config, n=n), control)
    out = []
    for request, prompt, response in zip(requests, prompts, responses):
        for choice in response.choices:
            completion = choice.sampled_token_ids()
            out.append(Trajectory(prompt, completion, [1] * len(completion), choice.text,
                                  choice.finish_reason == "length",
                                  [*request.messages, {"role": "assistant", "content": choice.text}],
                                  dict(request.rollout_infos),
                                  logprobs=_logprobs(choice) if config.logprobs else None))
    return out


def multi_turn(engine: InferEngine, template: Template, requests: list[RolloutInferRequest], config: RequestConfig,
               n: int, scheduler: MultiTurnScheduler, max_completion_length: int,
               control: JobControl | None = None) -> list[Trajectory]:
    """Every trajectory advances one turn per engine call (all active ones batched together), each
    within its own remaining token budget. The scheduler's state for a trajectory is released when
    the rollout ends, however the trajectory ended."""
    states = [copy.deepcopy(r) for r in requests for _ in range(n)]
    try:
        for state in states:
            state.uid = uuid.uuid4().hex  # n copies of one request are n trajectories
        # a trajectory that cannot start (e.g. its environment's reset failed now, though it passed when the
        # data was checked) gets no turn and no reward
        _each_trajectory(scheduler.start, states, "start")
        return _multi_turn(engine, template, states, config, scheduler, max_completion_length, control)
    finally:  # one trajectory's release failing loses none of the others, nor the batch
        for state in states:
            try:
                scheduler.release(state)
            except Exception as e:  # noqa: BLE001 - this trajectory's state only
                logger.warning(f"multi-turn scheduler {type(scheduler).__name__} failed to release a trajectory: "
                               f"{type(e).__name__}: {e}")


def _each_trajectory(hook, states: list[RolloutInferRequest], what: str) -> None:
    """A scheduler hook on every trajectory; one that fails marks that trajectory alone (rollout_error:
    it gets no reward), as a failed step does."""
    for state in states:
        try:
            hook(state)
        except Exception as e:  # noqa: BLE001 - this trajectory only
            logger.error(f"multi-turn scheduler {type(hook.__self__).__name__} failed to {what} a trajectory: "
                         f"{type(e).__name__}: {e}", exc_info=e)
            state.rollout_infos["rollout_error"] = type(e).__name__


def _budget(ids: list[int], prompt_len: int, max_completion_length: int, context: int | None) -> int:
    """Tokens a trajectory may still generate: within its completion budget and the engine's context."""
    left = max_completion_length - (len(ids) - prompt_len)
    return left if context is None else min(left, context - len(ids))


def _add_answer(state: RolloutInferRequest, text: str, turn_start: int, start: int, written: int) -> int:
    """The turn's text into the conversation: onto the assistant message the model continued (an
    edited answer), else as a new message. Returns where the final assistant message starts (a
    continued message the environment began counts as new; `written`: the one the last turn wrote)."""
    if state.messages[-1]["role"] == "assistant":
        if len(state.messages) - 1 != written:
            start = turn_start
        state.messages[-1] = {"role": "assistant", "content": state.messages[-1]["content"] + text}
    else:
        start = turn_start
        state.messages.append({"role": "assistant", "content": text})
    return start


def _multi_turn(engine: InferEngine, template: Template, states: list[RolloutInferRequest], config: RequestConfig,
                scheduler: MultiTurnScheduler, max_completion_length: int,
                control: JobControl | None) -> list[Trajectory]:
    ids = [template.encode_continuation(s.messages, s.tools) for s in states]
    prompt_len = [len(x) for x in ids]
    masks: list[list[int]] = [[] for _ in states]
    lps: list[list[float]] = [[] for _ in states]
    texts, truncated, turns = [""] * len(states), [False] * len(states), [0] * len(states)
    # where each trajectory's final assistant message starts, and the message its last turn wrote into
    starts, written = [0] * len(states), [-1] * len(states)
    context = getattr(engine, "max_model_len", None)  # the engine's context, where it has one
    who = f"multi-turn scheduler {type(scheduler).__name__}"
    active = [i for i, s in enumerate(states) if "rollout_error" not in s.rollout_infos]
    seed = config.seed
    while active:
        budget = {i: _budget(ids[i], prompt_len[i], max_completion_length, context) for i in active}
        for i in [i for i in active if budget[i] <= 0]:
            truncated[i] = True
        active = [i for i in active if budget[i] > 0]
        if not active:
            break
        # each trajectory's turn is limited by its own remaining budget, and draws from its own seed
        responses = _infer(
            engine, [InferRequest(input_ids=ids[i]) for i in active],
            [replace(config, n=1, max_tokens=min(config.max_tokens, budget[i]),
                     seed=None if seed is None else (seed + i * 7919 + turns[i] * 104729) % 2 ** 31) for i in active],
            control)
        still = []
        for i, response in zip(active, responses):
            choice = response.choices[0]
            generated = choice.sampled_token_ids()
            turn_start = len(ids[i]) - prompt_len[i]
            ids[i] = ids[i] + generated
            masks[i] += [1] * len(generated)
            lps[i] += _logprobs(choice) if config.logprobs else []
            turns[i] += 1
            state = states[i]
            starts[i] = _add_answer(state, choice.text, turn_start, starts[i], written[i])
            written[i] = len(state.messages) - 1
            texts[i], truncated[i] = state.messages[-1]["content"], choice.finish_reason == "length"
            try:  # the environment's step and its reply rendered: a failure ends this trajectory alone
                if scheduler.check_finished(state, choice, turns[i]):
                    continue
                result = scheduler.step(state, choice, turns[i])
                state = result["infer_request"]
                following = template.encode_continuation(state.messages, state.tools)
                if _common_prefix(ids[i], following) < prompt_len[i]:
                    following = _spliced(template.tokenizer, ids[i], following)
                mask, lp = continued(ids[i], following, prompt_len[i], masks[i], lps[i], who)
            except Exception as e:  # noqa: BLE001 - this trajectory's environment failed; the others go on
                logger.error(f"{who} failed on a trajectory after turn {turns[i]}; it ends there: "
                             f"{type(e).__name__}: {e}", exc_info=e)
                states[i].rollout_infos["rollout_error"] = type(e).__name__
                truncated[i] = True
                continue
            # what else step() returned (ms-swift's keys); a scheduler breaking that contract stops the run
            mask = _step_result(result, state, mask, turn_start, generated[:len(generated) - (
                choice.stop_token_id is not None)], who)
            if state is not states[i]:  # a scheduler that hands back a new request keeps the trajectory's identity
                state.uid = states[i].uid
            states[i] = state
            masks[i], lps[i], ids[i] = mask, lp, following
            room = _budget(following, prompt_len[i], max_completion_length, context)
            if room <= 0:  # the environment's reply outgrew the budget or the context: this trajectory ends
                keep = len(following) + room - prompt_len[i]  # here, truncated; the others go on
                ids[i], masks[i] = following[:prompt_len[i] + keep], masks[i][:keep]
                if config.logprobs:
                    lps[i] = lps[i][:keep]
                truncated[i] = True
                continue
            still.append(i)
        active = still
    _each_trajectory(scheduler.finish, states, "finish")
    return [Trajectory(ids[i][:prompt_len[i]], ids[i][prompt_len[i]:], masks[i], texts[i], truncated[i],
                       states[i].messages, dict(states[i].rollout_infos), turns[i],
                       lps[i] if config.logprobs else None, starts[i]) for i in range(len(states))]


def _step_result(result: dict, state: RolloutInferRequest, mask: list[int], turn_start: int, sampled: list[int],
                 who: str) -> list[int]:
    """ms-swift's keys of a step() result besides `infer_request`: `rollout_infos` joins the
    trajectory's; `response_loss_mask` (over `response_token_ids`, which must begin with the tokens
    sampled this turn) is ANDed with the loss mask of this turn's tokens, so it can take loss away
    from generated tokens, never give it to the environment's. Returns the loss mask."""
    if "rollout_logprobs" in result:
        raise SwiftError(f"{who}: step() returned rollout_logprobs, which this rollout does not read (it keeps the "
                         "engine's log-probs of the sampled tokens that remain); drop the key")
    infos = result.get("rollout_infos")
    if infos is not None:
        if not isinstance(infos, dict):
            raise SwiftError(f"{who}: step() returned rollout_infos as {type(infos).__name__}; it must be a dict")
        state.rollout_infos.update(infos)
    token_ids, loss = result.get("response_token_ids"), result.get("response_loss_mask")
    if loss is not None and token_ids is None:
        raise SwiftError(f"{who}: step() returned response_loss_mask without response_token_ids (its tokens)")
    if token_ids is None:
        return mask
    if list(token_ids[:len(sampled)]) != sampled:
        raise SwiftError(f"{who}: step() returned response_token_ids that do not begin with the tokens sampled this "
                         "turn; this rollout trains on the sampled tokens (return them first, or drop the key)")
    if loss is None:
        return mask
    if len(loss) != len(token_ids):
        raise SwiftError(f"{who}: step() returned {len(loss)} response_loss_mask values for {len(token_ids)} "
                         "response_token_ids")
    end = min(turn_start + len(loss), len(mask))
    return mask[:turn_start] + [m if x else 0 for m, x in zip(mask[turn_start:end], loss)] + mask[end:]


def continued(ids: list[int], following: list[int], prompt_len: int, mask: list[int], logprobs: list[float],
              who: str) -> tuple[list[int], list[float]]:
    """The loss mask (and sampler log-probs) of a trajectory whose tokens `ids` continue as `following`
    (the next turn's prompt): tokens the model generated and that were kept carry loss; everything new
    is the environment's (no loss, log-prob unknown)."""
    keep = _common_prefix(ids, following)
    if keep < prompt_len:
        raise SwiftError(f"{who} changed the prompt of a trajectory")
    added = len(following) - keep
    return mask[:keep - prompt_len] + [0] * added, logprobs[:keep - prompt_len] + [float("nan")] * added


def _spliced(tokenizer, ids: list[int], following: list[int]) -> list[int]:
    """The next turn's ids as the tokens sampled so far plus the template's own ids for the rest,
    when re-rendering merged the answer's first characters with the text before it (an answer
    starting "\n" after a prompt ending "\n" re-tokenizes as "\n\n"): the prompt and the answer keep
    the tokens they were sampled as (before 2026-12-07 such a trajectory ended as "changed the
    prompt"). The rest is cut from the template's encoding at the token where its text reaches the
    text so far, so what the template keeps as plain text (control-token text in a reply, under
    `split_special_tokens`) stays so. Unchanged when no token of it ends there (a scheduler that
    edited the conversation)."""
    def text(x):
        return tokenizer.decode(x, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    so_far = text(ids)
    for j in range(_common_prefix(ids, following), len(following) + 1):
        head = text(following[:j])
        if head == so_far:
            return list(ids) + following[j:]
        if len(head) > len(so_far):
            break
    return following


def _common_prefix(a: list[int], b: list[int]) -> int:
    k = 0
    for x, y in zip(a, b):
        if x != y:
            break
        k += 1
    return k


def rollout(engine: InferEngine, template: Template, requests: list[RolloutInferRequest], config: RequestConfig,
            n: int, *, scheduler: MultiTurnScheduler | None = None, max_completion_length: int = 512,
            control: JobControl | None = None) -> list[Trajectory]:
    """n trajectories per request, request-major. An engine that runs whole rollouts itself (a
    `swift rollout` server, whose scheduler runs server-side) is handed the requests as they are.
    `control` (a rollout server's job): its deadline or cancellation stops the rollout between
    decode steps with JobStopped. The template's `loss_scale` decides which generated tokens of a
    multi-turn trajectory (this process's or the server's) carry loss: `default` every turn's,
    `last_round` the final assistant message's."""
    if hasattr(engine, "rollout"):
        out = engine.rollout(requests, config, n, max_completion_length=max_completion_length)
    elif scheduler is None:
        return single_turn(engine, template, requests, config, n, control)
    else:
        out = multi_turn(engine, template, requests, config, n, scheduler, max_completion_length, control)
    if template.loss_scale == "last_round":  # as ms-swift: the final assistant message alone carries loss
        for t in out:
            t.loss_mask = [0] * min(t.last_round, len(t.loss_mask)) + t.loss_mask[t.last_round:]
    return out

"""TRL's `rollout_func`, run unchanged: `--rollout_func file.py:func` (or module:func, pkg.mod.func).

TRL 1.x calls `rollout_func(prompts, trainer)` in place of its own generation. `prompts` holds each
row's prompt once per generation, in order (a message list for conversational rows, the text for a
row whose `prompt` column is text); the function returns a dict of per-row lists:

- `prompt_ids`, `completion_ids`: token ids (required);
- `logprobs`: the sampler's log-prob of each completion token (required; `None` for the whole key,
  or `None` at a token, where unknown); where given, the loss corrects for the sampler with the
  importance weights of `--rollout_importance_sampling_mode`, as TRL does with vLLM;
- `env_mask` (optional): 1 where the model generated the token, 0 where an environment added it
  (those tokens carry no loss);
- any other key: handed to the reward functions by that name, one value per row (a value that is
  not a list is given to every row), as TRL's `extra_fields`.

The completion the rewards judge is the decoded completion ids (special tokens skipped), as TRL's.
A completion whose last token is not an end token counts as truncated. `trainer` is a view of the
running trainer with what TRL's functions read: `processing_class` (the tokenizer), `model`,
`accelerator`, `state`, `num_generations`, and `args`, which answers TRL's GRPOConfig names
(`max_completion_length`, `temperature`, `num_generations`, ...) from our flags.
"""
from __future__ import annotations

import copy

from swift.plugin import load_attr
from swift.rollout.multi_turn import RolloutInferRequest
from swift.rollout.runner import Trajectory
from swift.utils.registry import SwiftError

FLAG = "--rollout_func"
REQUIRED = ("prompt_ids", "completion_ids", "logprobs")


class _Args:
    """TRL's `trainer.args`: the online-RL flags first (TRL's GRPOConfig names them so), then the
    training arguments."""

    def __init__(self, rlhf_args, training_args):
        self._sources = (rlhf_args, training_args)

    def __getattr__(self, name: str):
        for source in self._sources:
            if hasattr(source, name):
                return getattr(source, name)
        raise AttributeError(f"{FLAG}: trainer.args has no {name!r} (neither a swift rlhf flag nor a training "
                             "argument of that name)")


class TrainerView:
    """What a TRL rollout function may read of the trainer; anything else is the trainer's own."""

    def __init__(self, trainer):
        self._trainer = trainer
        self.args = _Args(trainer.rlhf_args, trainer.args)
        self.num_generations = trainer.rlhf_args.num_generations

    def __getattr__(self, name: str):
        return getattr(self._trainer, name)


class RolloutFunc:
    """Trajectories from a TRL rollout function, for `Rollout.generate_with_current_weights`."""

    def __init__(self, spec: str, trainer):
        self.spec = spec
        self.func = load_attr(spec, FLAG)
        self.trainer = trainer
        self.view = TrainerView(trainer)
        # the tokens that end an answer (TRL: the generation config's end tokens and the pad token)
        tokenizer, config = trainer.processing_class, getattr(trainer.model, "generation_config", None)
        eos = getattr(config, "eos_token_id", None)
        self.end_ids = {*(eos if isinstance(eos, (list, tuple)) else [eos]), tokenizer.eos_token_id,
                        tokenizer.pad_token_id} - {None}

    def __call__(self, requests: list[RolloutInferRequest], n: int) -> list[Trajectory]:
        rows = [r for r in requests for _ in range(n)]
        prompts = [copy.deepcopy(self._prompt(r)) for r in rows]
        output = self.func(prompts, self.view)
        if not isinstance(output, dict):
            raise SwiftError(f"{FLAG} {self.spec} returned {type(output).__name__}, not a dict of per-row lists")
        missing = [k for k in REQUIRED if k not in output]
        if missing:
            raise SwiftError(f"{FLAG} {self.spec} must return the keys {', '.join(REQUIRED)}; missing "
                             f"{', '.join(missing)}")
        columns = {k: self._per_row(k, v, len(rows)) for k, v in output.items()
                   if v is not None or k not in ("logprobs", "env_mask")}  # None: not given (TRL)
        return [self._trajectory(r, i, columns) for i, r in enumerate(rows)]

    @staticmethod
    def _prompt(request: RolloutInferRequest):
        text = request.data_dict.get("prompt")
        return text if isinstance(text, str) else request.messages

    def _per_row(self, key: str, value, rows: int) -> list:
        if key in (*REQUIRED, "env_mask") and not isinstance(value, (list, tuple)):
            raise SwiftError(f"{FLAG} {self.spec}: {key!r} must be a list with one entry per prompt, got "
                             f"{type(value).__name__}")
        if not isinstance(value, (list, tuple)):
            return [value] * rows  # TRL: a value that is not a list goes to every row
        if len(value) != rows:
            raise SwiftError(f"{FLAG} {self.spec}: {key!r} has {len(value)} entries for {rows} prompts (each row's "
                             "prompt comes once per generation)")
        return list(value)

    def _trajectory(self, request: RolloutInferRequest, i: int, columns: dict[str, list]) -> Trajectory:
        tokenizer = self.trainer.processing_class
        prompt_ids, completion_ids = [int(t) for t in columns["prompt_ids"][i]], \
            [int(t) for t in columns["completion_ids"][i]]
        mask = columns.get("env_mask", [None] * (i + 1))[i]
        mask = [1] * len(completion_ids) if mask is None else [int(bool(m)) for m in mask]
        logprobs = columns.get("logprobs")
        row = None if logprobs is None else logprobs[i]
        logprobs = None if logprobs is None else [float("nan")] * len(completion_ids) if row is None else \
            [float("nan") if v is None else float(v) for v in row]
        for name, values in (("env_mask", mask), ("logprobs", logprobs)):
            if values is not None and len(values) != len(completion_ids):
                raise SwiftError(f"{FLAG} {self.spec}: row {i}'s {name} has {len(values)} entries for "
                                 f"{len(completion_ids)} completion tokens")
        ends = self.end_ids
        text = tokenizer.decode(completion_ids, skip_special_tokens=True)
        extra = {k: v[i] for k, v in columns.items() if k not in (*REQUIRED, "env_mask")}
        return Trajectory(prompt_ids, completion_ids, mask, text,
                          truncated=not completion_ids or completion_ids[-1] not in ends,
                          messages=[*request.messages, {"role": "assistant", "content": text}],
                          rollout_infos={**request.rollout_infos, **extra},
                          logprobs=logprobs)

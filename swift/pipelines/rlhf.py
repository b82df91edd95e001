"""`swift rlhf`: preference alignment, reward models and distillation on the shared trainer path.

The algorithm's registry entry picks the row encoder (by its `data`), the trainer (by its
`trainer`), the model head (by its `task_type`) and whether a reference model is needed."""
from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Callable

import torch

from swift.arguments.rlhf import RLHFArguments
from swift.dataset.encode import encode_rows
from swift.dataset.loader import RowSet
from swift.dataset.preprocess import as_bool
from swift.arguments.deepspeed import zero3
from swift.model import load_model
from swift.pipelines.base import resolve_args
from swift.pipelines.train import TrainPipeline
from swift.template.base import IGNORE_INDEX, RowError, Template
from swift.trainers.grpo import GRPOTrainer
from swift.trainers.harmless import HarmlessTrainer
from swift.trainers.ppo import PPOTrainer
from swift.trainers.rlhf import ClassifierTrainer, DistillTrainer, PreferenceTrainer
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)

TRAINERS = {"preference": PreferenceTrainer, "classifier": ClassifierTrainer, "distill": DistillTrainer,
            "rollout": GRPOTrainer}


def _split_completion(template: Template, row: dict) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, completion ids, completion labels): the completion starts at the first labelled token."""
    enc = template.encode(row)
    start = next(i for i, t in enumerate(enc.labels) if t != IGNORE_INDEX)
    return enc.input_ids[:start], enc.input_ids[start:], enc.labels[start:]


def encode_pair(template: Template, row: dict, a=None) -> dict:
    """Chosen (the row's last assistant turn) and rejected (`rejected_response`), loss on the answer only."""
    if "rejected_response" not in row:
        raise RowError("no rejected response (preference data needs chosen and rejected)")
    messages = row["messages"]
    if messages[-1]["role"] != "assistant":
        raise RowError("the last message must be the chosen assistant answer")
    chosen = template.encode(row)
    rejected = template.encode({**row, "messages": [*messages[:-1],
                                                    {"role": "assistant", "content": row["rejected_response"]}]})
    sample = {"sequences": [(chosen.input_ids, chosen.labels), (rejected.input_ids, rejected.labels)]}
    if row.get("margin") is not None:
        try:
            sample["margin"] = float(row["margin"])
        except (TypeError, ValueError):
            raise RowError(f"margin {row['margin']!r} is not a number") from None
    return sample


def encode_unpaired(template: Template, row: dict, a=None) -> dict:
    """One answer with its KTO `label` (true = desirable); the mismatched partner is added per batch."""
    if "label" not in row:
        raise RowError("no 'label' column (KTO data marks each answer desirable: true or false)")
    if row["messages"][-1]["role"] != "assistant":
        raise RowError("the last message must be the assistant answer being labelled")
    label = as_bool(row["label"])  # read here, where it is KTO's: other commands keep the row's own value
    prompt, completion, labels = _split_completion(template, row)
    return {"sequences": [(prompt + completion, [IGNORE_INDEX] * len(prompt) + labels)], "label": label,
            "_prompt": prompt, "_completion": (completion, labels)}


def mismatched_block(batch_size: int, grad_accum: int, world_size: int, rlhf_type: str) -> int:
    """Rows per block of KTO's mismatched pairs: one optimizer step's rows over all ranks (ms-swift's
    prepare_kto_dataset). One row alone could only be paired with itself, and the KL baseline would
    then be the row's own reward (TRL refuses a batch size of 1 for that reason)."""
    block = batch_size * grad_accum * world_size
    if block <= 1:
        raise SwiftError(f"--rlhf_type {rlhf_type} needs more than 1 row per optimizer step "
                         f"(--per_device_train_batch_size {batch_size} × --gradient_accumulation_steps {grad_accum} "
                         f"× {world_size} rank(s) = {block}): its KL baseline pairs each prompt with another row's "
                         "answer; raise one of them")
    return block


def _block_bounds(n: int, block: int) -> list[tuple[int, int]]:
    """Consecutive blocks of `block` rows; a last block of one row joins the one before it."""
    starts = list(range(0, n, block))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    return list(zip(starts, [*starts[1:], n]))


def _mismatched(prompt: list[int], completion: list[int], labels: list[int],
                max_length: int | None) -> tuple[list[int], list[int]]:
    """`prompt` followed by another row's completion, whose end is cut to fit `max_length`. Some of
    it always remains: the prompt is the row's own, which fits with at least one answer token."""
    room = len(completion) if max_length is None else max(max_length - len(prompt), 0)
    return prompt + completion[:room], [IGNORE_INDEX] * len(prompt) + labels[:room]


def add_mismatched(samples: list[dict], block: int, max_length: int | None = None,
                   what: str = "the dataset") -> list[dict]:
    """KTO's KL baseline (eq. 8) is estimated from mismatched pairs: in consecutive blocks of `block`
    rows in data order, each prompt with the previous row's completion, (x_1, y_n), (x_2, y_1), ...
    (ms-swift's prepare_kto_dataset, TRL's shift by one). A last block of a single row joins the block
    before it, so no row is ever paired with its own completion. The pairs are fixed here, at encoding
    time (precomputed reference log-probs stay valid); the sampler then shuffles the rows, so a
    micro-batch's mismatched completions are other rows' of the data, not of its own micro-batch.
    A mismatched sequence keeps its prompt and is cut at the end to `max_length`."""
    if len(samples) == 1:
        raise SwiftError(f"{what} holds 1 row after encoding: KTO's KL baseline pairs each prompt with another "
                         "row's answer, so it needs at least 2")
    for start, end in _block_bounds(len(samples), block):
        group = samples[start:end]
        for i, s in enumerate(group):
            completion, labels = group[i - 1]["_completion"]
            s["sequences"].append(_mismatched(s["_prompt"], completion, labels, max_length))
    for s in samples:
        del s["_prompt"], s["_completion"]
    return samples


def encode_steps(template: Template, row: dict, a) -> dict:
    """Process supervision: `completions` (a list of steps) and `labels` (one bool per step). Each
    step is followed by `--step_separator`, whose last token carries the step's label."""
    steps, labels = row.get("completions"), row.get("labels")
    if not isinstance(steps, list) or not isinstance(labels, list) or not steps:
        raise RowError("process-reward rows need 'completions' (a list of steps) and 'labels' (one bool per step)")
    if len(steps) != len(labels):
        raise RowError(f"{len(steps)} steps but {len(labels)} labels")
    labels = [int(as_bool(x, "step label")) for x in labels]  # every label, also those of steps cut below
    ids = template.encode_prompt(row["messages"])
    targets = [IGNORE_INDEX] * len(ids)
    for step, label in zip(steps, labels):
        step_ids = template.tokenizer.encode(str(step) + a.step_separator, add_special_tokens=False)
        if a.max_length and len(ids) + len(step_ids) > a.max_length:
            break  # later steps do not fit
        ids += step_ids
        targets += [IGNORE_INDEX] * (len(step_ids) - 1) + [label]
    if all(t == IGNORE_INDEX for t in targets):
        raise RowError(f"no step fits in --max_length {a.max_length}")
    return {"sequences": [(ids, targets)]}


def encode_conversation(template: Template, row: dict, a=None) -> dict:
    """A conversation with loss on the last answer, and its prompt for on-policy generation."""
    if row["messages"][-1]["role"] != "assistant":
        raise RowError("the last message must be the assistant answer")
    enc = template.encode(row)
    return {"sequences": [(enc.input_ids, enc.labels)], "prompt_ids": template.encode_prompt(row["messages"])}


def encode_prompt_row(template: Template, row: dict, a=None) -> dict:
    """Online RL: the prompt (a trailing assistant answer is dropped) and every other column by name."""
    messages = list(row["messages"])
    if messages and messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    if not messages:
        raise RowError("no prompt: the row has only an assistant message")
    if row.get("tools"):  # never dropped without a word
        raise RowError("online RL does not pass a row's tools to the rollout yet; remove the tools column")
    template.encode_prompt(messages)  # fail here, with the row, if the prompt cannot be rendered
    columns = {k: v for k, v in row.items() if k != "messages"}
    if a is not None and "verifiers" in a.reward_funcs and not row.get("verifiers_env"):
        raise RowError("--reward_funcs verifiers scores rows of --dataset verifiers:<env> (their environment's rubric)")
    if a is not None and row.get("verifiers_env"):
        _check_verifiers_run(a)
    if a is not None and a.multi_turn_scheduler:  # and if the environment cannot start from it
        from swift.rollout.multi_turn import RolloutInferRequest

        try:
            _scheduler(a.multi_turn_scheduler, a.max_turns, a.gym_env, tuple(a.environment_factory)).check_request(
                RolloutInferRequest(messages, columns))
        except SwiftError as e:
            raise RowError(str(e)) from None
        except Exception as e:  # a plugin scheduler's own check: still this row's fault
            raise RowError(f"{type(e).__name__}: {e}") from None
    return {"messages": messages, "columns": columns}


def _check_verifiers_run(a) -> None:
    """verifiers:<env> rows run their environment's own rollout loop: what would replace it or run
    elsewhere is refused (once per run, before anything is generated)."""
    # (--max_turns and --gym_env without a scheduler are refused with the arguments: `rlhf_online`)
    other = ("--rollout_func" if a.rollout_func else "--multi_turn_scheduler / --environment_factory"
             if a.multi_turn_scheduler else None)
    if other:
        raise SwiftError(f"--dataset verifiers:<env> rows run their environment's own rollout; drop {other}")
    if (a.use_vllm and a.vllm_mode == "server") or a.rollout_mode == "server":
        raise SwiftError("--dataset verifiers:<env> runs the environment in the trainer: it needs a colocated engine "
                         "(no --vllm_mode server / --rollout_mode server)")
    if a.rlhf_type == "harmless":
        raise SwiftError("--rlhf_type harmless samples its proposal's answers single-turn: verifiers:<env> rows are "
                         "not supported there")


@functools.lru_cache(maxsize=4)
def _scheduler(name: str | None, max_turns: int | None, env: str | None, environment_factory: tuple = ()):
    from swift.rollout.multi_turn import build_scheduler

    return build_scheduler(name, max_turns, env=env, environment_factory=list(environment_factory))


def _encode_row(encode, template: Template, args, row: dict) -> dict:
    return encode(template, row, args)


ENCODERS: dict[str, Callable[..., dict]] = {"pair": encode_pair, "unpaired": encode_unpaired, "steps": encode_steps,
                                            "conversation": encode_conversation, "prompt": encode_prompt_row}


class SequenceCollator:
    """Pads every sample's sequences into one batch ordered [seq 0 of each row..., seq 1 of each row...]
    (for pairs: [chosen..., rejected...]); carries `ref_logps`, `label`, `margin` and `prompt_ids`."""

    def __init__(self, pad_token_id: int):
        self.pad = pad_token_id

    def __call__(self, batch: list[dict]) -> dict[str, Any]:
        k = len(batch[0]["sequences"])
        seqs = [b["sequences"][j] for j in range(k) for b in batch]
        width = max(len(ids) for ids, _ in seqs)
        ids = torch.full((len(seqs), width), self.pad, dtype=torch.long)
        labels = torch.full((len(seqs), width), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, (x, y) in enumerate(seqs):
            ids[i, :len(x)], labels[i, :len(y)], mask[i, :len(x)] = torch.tensor(x), torch.tensor(y), 1
        out: dict[str, Any] = {"input_ids": ids, "labels": labels, "attention_mask": mask}
        if "ref_logps" in batch[0]:
            out["ref_logps"] = torch.tensor([b["ref_logps"][j] for j in range(k) for b in batch])
        if "label" in batch[0]:
            out["label"] = torch.tensor([bool(b["label"]) for b in batch])
        if any("margin" in b for b in batch):
            out["margin"] = torch.tensor([b.get("margin", 0.0) for b in batch])
        if "prompt_ids" in batch[0]:
            out["prompt_ids"] = [b["prompt_ids"] for b in batch]
        return out


class PromptCollator:
    """Online RL batches are lists of prompt rows; the trainer generates from them."""

    def __call__(self, batch: list[dict]) -> list[dict]:
        return batch


class RLHFPipeline(TrainPipeline):
    task_types = ("causal_lm", "seq_cls", "token_cls")

    def __init__(self, args: RLHFArguments):
        super().__init__(args)
        self.algorithm = args.rlhf_args.algorithm
        # an online algorithm with a learned critic (or proposal) trains it beside the policy
        self.trainer_cls = PPOTrainer if self.algorithm.critic else HarmlessTrainer if self.algorithm.proposal \
            else TRAINERS[self.algorithm.trainer]

    def row_encoder(self, template: Template):
        return functools.partial(_encode_row, ENCODERS[self.algorithm.data], template, self.args)

    def encode(self, rowset: RowSet, template: Template, desc: str) -> list[dict]:
        a = self.args
        samples = encode_rows(rowset, self.row_encoder(template), strict=a.strict, desc=desc,
                              num_proc=a.dataset_num_proc)
        if self.algorithm.data == "unpaired" and samples:
            block = mismatched_block(a.per_device_train_batch_size, a.gradient_accumulation_steps,
                                     a.training_args.world_size, a.rlhf_type)
            samples = add_mismatched(samples, block, template.max_length, what=desc.replace("encode", "the") + " data")
        return samples

    def collator(self, tokenizer, model):
        return PromptCollator() if self.algorithm.data == "prompt" else SequenceCollator(tokenizer.pad_token_id)

    def trainer_kwargs(self, model) -> dict[str, Any]:
        a, algo = self.args, self.algorithm
        extra: dict[str, Any] = {"algorithm": algo, "rlhf_args": a.rlhf_args}
        if algo.reference and a.beta != 0:  # grpo with β = 0 loads no reference model
            if a.ref_adapters:  # its own model with these adapters merged in
                extra["ref_model"] = self._reference_with_adapters()
            elif a.ref_model:
                extra["ref_model"] = load_model(a.ref_model, use_hf=a.use_hf, torch_dtype=a.torch_dtype,
                                                check_model=a.check_model)[0]
            elif a.tuner_type == "lora" or a.adapters or a.precompute_ref_log_probs:
                # LoRA and --adapters: the policy with its adapters disabled (the base, no second copy);
                # precompute: the policy at step 0
                extra["ref_model"] = None
                if a.adapters and not a.precompute_ref_log_probs:
                    logger.info(f"the reference model is the base without --adapters {' '.join(a.adapters)} (as "
                                "in ms-swift); to make it the adapted model, give the same directories to "
                                "--ref_adapters")
            elif zero3(a.training_args):  # the policy's weights are partitioned: load the reference again
                extra["ref_model"] = load_model(a.model, use_hf=a.use_hf, revision=a.model_revision,
                                                torch_dtype=a.torch_dtype, attn_impl=a.attn_impl)[0]
            else:
                extra["ref_model"] = copy.deepcopy(model)  # full tuning: freeze the starting weights
        if algo.trainer == "distill":
            teacher = load_model(a.teacher_model, use_hf=a.use_hf, torch_dtype=a.torch_dtype,
                                 check_model=a.check_model)[0]
            if teacher.config.vocab_size != model.config.vocab_size:
                raise SwiftError(f"--teacher_model {a.teacher_model} has a vocabulary of {teacher.config.vocab_size} "
                                 f"tokens, the student {model.config.vocab_size}; distillation needs the same one")
            extra["teacher_model"] = teacher
        if algo.trainer == "rollout":
            extra.update(self._rollout_parts(model))
        return extra

    def _reference_with_adapters(self):
        from swift.model.loader import whole_weights
        from swift.tuners import PeftModel

        a = self.args
        with whole_weights():  # merged whole (the trainer partitions it under ZeRO-3)
            model = load_model(a.ref_model or a.model, use_hf=a.use_hf, revision=None if a.ref_model else a.model_revision,
                               torch_dtype=a.torch_dtype, attn_impl=a.attn_impl, check_model=a.check_model)[0]
        for path in a.ref_adapters:
            model = PeftModel.from_pretrained(model, path).merge_and_unload()
        return model

    def _rollout_parts(self, model) -> dict[str, Any]:
        from swift.rewards.manager import RewardManager, build_reward_funcs
        from swift.rollout.trl_env import environment_rewards

        a = self.args
        if a.per_device_train_batch_size % a.num_generations:
            raise SwiftError(f"--per_device_train_batch_size ({a.per_device_train_batch_size}) counts completions and "
                             f"must be a multiple of --num_generations ({a.num_generations})")
        # the one the rows were checked with (an environment pool is not built twice)
        scheduler = _scheduler(a.multi_turn_scheduler, a.max_turns, a.gym_env, tuple(a.environment_factory))
        _scheduler.cache_clear()  # this run keeps it; a later run in this process builds its own
        funcs = build_reward_funcs(a.reward_funcs, a.rlhf_args, a.reward_model, a.reward_model_url,
                                   process=bool(a.prm_model),
                                   extra=environment_rewards(scheduler))
        parts = {"reward_manager": RewardManager(funcs, a.reward_weights or None),
                 "scheduler": scheduler,
                 "engine_factory": self._engine_factory()}
        if self.algorithm.critic:
            parts["critic"] = self._critic(model)
        # a second copy of the start, tuned as the policy (the adapter and heads: in the trainer)
        if a.proposal == "copy" or a.parameterization == "modulation_model":
            from swift.tuners import prepare_model

            parts["proposal_model"] = prepare_model(copy.deepcopy(model), a.tuner_args, task_type="causal_lm")
        if a.prm_model:
            from swift.rewards.process import ProcessRewardModel

            parts["process_rewards"] = ProcessRewardModel(a.prm_model, self.template.tokenizer, a.step_separator,
                                                          device=a.training_args.device)
        return parts

    def _critic(self, model):
        """The critic `--critic_backbone` names: `separate`, a one-label token-classification head on
        --critic_model (default: the policy's starting weights, its --adapters merged in), tuned as
        --tuner_type; or `shared`, a value head on the policy's last hidden state."""
        from swift.trainers.critic import SeparateCritic, SharedCritic
        from swift.tuners import PeftModel, prepare_model

        a = self.args
        device = a.training_args.device
        if a.critic_backbone == "shared":
            return SharedCritic(model.config.get_text_config().hidden_size, device)
        critic = load_model(a.critic_model or a.model, use_hf=a.use_hf,
                            revision=None if a.critic_model else a.model_revision, torch_dtype=a.torch_dtype,
                            attn_impl=a.attn_impl, task_type="token_cls", num_labels=1, check_model=a.check_model)[0]
        if not a.critic_model:
            for path in a.adapters:
                critic = PeftModel.from_pretrained(critic, path).merge_and_unload()
        critic = prepare_model(critic, dataclasses.replace(a.tuner_args, adapters=[]), task_type="token_cls")
        return SeparateCritic(critic, device, a.disable_dropout)

    def _engine_factory(self):
        a = self.args
        template = self.template

        def transformers_engine(model):
            from swift.infer.transformers_engine import TransformersEngine
            from swift.trainers.zero3 import whole_copy

            adapter = getattr(model, "active_adapter", None) if hasattr(model, "peft_config") else None
            if zero3(a.training_args) or a.training_args.fsdp:  # partitioned: generate with a whole copy, synced bucket-wise
                model, adapter = whole_copy(model).to(a.training_args.device), None
            # inline: decoding in the training thread (a second thread's kernels would fight it for the cores)
            return TransformersEngine(model, template.tokenizer, template, default_adapter=adapter,
                                      max_batch_size=max(a.per_device_train_batch_size, 8), inline=True)

        def vllm_engine(model):
            from swift.infer.vllm_engine import colocated_vllm_engine

            return colocated_vllm_engine(model, template, gpu_memory_utilization=a.vllm_gpu_memory_utilization,
                                         max_model_len=a.vllm_max_model_len, seed=a.seed,
                                         enforce_eager=a.vllm_enforce_eager)

        def rollout_server(model):
            from swift.rollout.client import RolloutClient

            client = RolloutClient(a.vllm_server_host, a.vllm_server_port, timeout=a.vllm_server_timeout,
                                   bucket_mb=a.weight_sync_bucket_mb, api_key=a.vllm_server_api_key)
            if a.use_vllm and client.info["engine_type"] != "VllmEngine":
                raise SwiftError(f"--use_vllm true --vllm_mode server, but the rollout server {client.url} runs "
                                 f"{client.info['engine_type']}: start it with --infer_backend vllm, or train with "
                                 "--rollout_mode server")
            return client

        if a.rlhf_args.server_mode:
            return rollout_server
        return vllm_engine if a.use_vllm else transformers_engine


def rlhf_main(args: RLHFArguments | list[str] | None = None) -> dict[str, Any]:
    """Run `swift rlhf`; returns output dir, checkpoints and final metrics like `sft_main`."""
    return RLHFPipeline(resolve_args(RLHFArguments, args, "swift rlhf")).run()

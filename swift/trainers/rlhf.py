"""Trainers of `swift rlhf`. Each computes what its family of algorithms needs and hands it to the
algorithm's loss (looked up in `swift.rlhf.ALGORITHMS`), which returns its terms (sums, each divided
once by its count over the optimizer step: `swift.rlhf.reduce`) and its metrics:

- PreferenceTrainer: log-probs of every sequence in one concatenated forward, and the reference's
  (a separate model, the policy with its LoRA adapters disabled, or precomputed once).
- ClassifierTrainer: the logits of a value head (reward and process reward models).
- DistillTrainer: student and teacher distributions at the answer tokens; a `--lmbda` fraction of
  steps trains on answers the student generates itself with the inference engine.
"""
from __future__ import annotations

import contextlib
import random
from collections import defaultdict
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import Trainer

from swift.infer.protocol import InferRequest, RequestConfig
from swift.rlhf import gkd
from swift.rlhf.logps import (IGNORE_INDEX, SequenceLogps, head_logps, hidden_states_out, labelled_positions,
                              plain_head, target_logps)
from swift.rlhf.reduce import Terms, set_step_counts, step_loss
from swift.trainers.zero3 import frozen_zero3, zero3_enabled


def forward_logps(model, inputs: dict, keep: torch.Tensor, whole_sequence: bool = False) -> SequenceLogps:
    """Log-probs of the labels, projecting to the vocabulary only where a label follows (`logits_to_keep`).
    With `whole_sequence`, every position is projected and every token's log-prob is summed as well.
    Models with a plain output layer never hold the whole logits (`swift.rlhf.logps.head_logps`)."""
    forward = dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                   logits_to_keep=0 if whole_sequence else keep, use_cache=False)
    if plain_head(model) is not None:
        with hidden_states_out(model) as head:
            hidden = model(**forward).logits
        labels = inputs["labels"][:, 1:]
        if not whole_sequence:
            targets = labels[:, keep]
            return SequenceLogps(head_logps(hidden, head, targets)[0].sum(-1), (targets != IGNORE_INDEX).sum(-1))
        # every token's log-prob; labels copy the input ids where set, so theirs are among them
        tokens = inputs["input_ids"][:, 1:].masked_fill(inputs["attention_mask"][:, 1:] == 0, IGNORE_INDEX)
        per_token = head_logps(hidden[:, :-1], head, tokens)[0]
        labelled = labels != IGNORE_INDEX
        if torch.equal(labels[labelled], tokens[labelled]):
            sums = (per_token * labelled).sum(-1)
        else:
            sums = head_logps(hidden[:, :-1], head, labels)[0].sum(-1)
        return SequenceLogps(sums, labelled.sum(-1), per_token.sum(-1), (tokens != IGNORE_INDEX).sum(-1))
    logits = model(**forward).logits
    if not whole_sequence:
        return SequenceLogps(*target_logps(logits, inputs["labels"][:, 1:][:, keep])[:2])
    sums, lengths, _ = target_logps(logits[:, :-1], inputs["labels"][:, 1:])
    tokens = inputs["input_ids"][:, 1:].masked_fill(inputs["attention_mask"][:, 1:] == 0, IGNORE_INDEX)
    all_sums, all_lengths, _ = target_logps(logits[:, :-1], tokens)
    return SequenceLogps(sums, lengths, all_sums, all_lengths)


def disable_dropout(*models) -> None:
    """Dropout probability 0 in every dropout layer (LoRA's included), as TRL's `disable_dropout`, and
    in attention, which applies its dropout as a function."""
    for model in models:
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
            if isinstance(getattr(module, "attention_dropout", None), float):
                module.attention_dropout = 0.0


class RLHFTrainer(Trainer):
    """Shared by the trainers: the step-level normalisation of every loss (`swift.rlhf.reduce`: each
    algorithm returns sums and the kinds of count they are divided by, counted over the whole
    optimizer step before its first forward) and metrics averaged per logging step under TRL's names.

    A micro-batch's loss is its share of the step's, so the HF Trainer must not divide it by the
    gradient-accumulation steps again (`loss_is_scaled_for_ga`)."""

    loss_is_scaled_for_ga = True

    def __init__(self, *args, algorithm, rlhf_args, **kwargs):
        super().__init__(*args, **kwargs)
        self.algorithm = algorithm
        self.rlhf_args = rlhf_args
        if rlhf_args.disable_dropout:
            disable_dropout(self.model)
        self._metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}

    def frozen(self, model):
        """A reference/teacher/reward model ready for no-grad forwards on this rank's device (under
        ZeRO-3 partitioned like the policy)."""
        if model is None:
            return None
        model.eval().requires_grad_(False)
        if zero3_enabled(self):
            return frozen_zero3(model, self)
        model = model.to(self.args.device)
        if self.accelerator.mixed_precision in ("bf16", "fp16"):
            # the policy's forward runs under the accelerator's autocast; the same weights must give a
            # reference (or teacher) the same numbers
            dtype = torch.bfloat16 if self.accelerator.mixed_precision == "bf16" else torch.float16
            model.forward = torch.autocast(self.args.device.type, dtype=dtype)(model.forward)
        return model

    @property
    def shifted_labels(self) -> bool:
        """Labels name the next token (a causal LM), not the token itself (a token classifier's)."""
        return self.algorithm.task_type != "token_cls"

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """The optimizer step's micro-batches (`step_batches` may replace them, e.g. with sampled
        answers), each given the counts of the whole step (`swift.rlhf.reduce.set_step_counts`)."""
        samples, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
        samples = self.step_batches(samples)
        set_step_counts(samples, self.accelerator, shifted=self.shifted_labels)
        return samples, None

    def step_batches(self, samples: list[dict]) -> list[dict]:
        return samples

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        terms, metrics = self.loss_and_metrics(model, inputs)
        training = self.model.training
        loss = step_loss(terms, inputs, self.accelerator.num_processes, self.shifted_labels, training)
        mode = "train" if training else "eval"
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)
        return (loss, None) if return_outputs else loss

    def loss_and_metrics(self, model, inputs) -> tuple[Terms, dict[str, float]]:
        """The loss's terms (`swift.rlhf.reduce`) and the metrics of this micro-batch."""
        raise NotImplementedError  # each trainer below defines it

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Each metric is the mean of its values since the last log, over every rank's values."""
        mode = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        prefix = "eval_" if mode == "eval" else ""
        totals = {key: (sum(values), len(values)) for key, values in self._metrics[mode].items() if values}
        if self.accelerator.num_processes > 1:
            import torch.distributed as dist

            everyone: list = [None] * self.accelerator.num_processes
            dist.all_gather_object(everyone, totals)  # ranks may log different keys (e.g. KTO's rewards/chosen)
            totals = {}
            for part in everyone:
                for key, (total, count) in part.items():
                    s, c = totals.get(key, (0.0, 0))
                    totals[key] = (s + total, c + count)
        for key, (total, count) in totals.items():
            logs[prefix + key] = total / count
        self._metrics[mode].clear()
        super().log(logs, start_time)


class PreferenceTrainer(RLHFTrainer):
    def __init__(self, *args, ref_model=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.ref_model = self.frozen(ref_model)
        if self.algorithm.reference and self.rlhf_args.precompute_ref_log_probs:
            for dataset in (self.train_dataset, self.eval_dataset):
                if dataset is not None:
                    self._precompute(dataset)
            self.ref_model = None  # no longer needed: freed before training starts

    def _reference_logps(self, inputs, keep) -> SequenceLogps:
        with torch.no_grad():
            if self.ref_model is not None:
                return forward_logps(self.ref_model, inputs, keep)
            # LoRA: the reference is the same weights without the adapters, not a second copy
            unwrapped = self.accelerator.unwrap_model(self.model)
            ctx = unwrapped.disable_adapter() if hasattr(unwrapped, "disable_adapter") else contextlib.nullcontext()
            with ctx:
                return forward_logps(self.model, inputs, keep)

    def _precompute(self, dataset) -> None:
        """Store each sample's reference log-prob sums (`ref_logps`, one per sequence)."""
        size = self.args.per_device_eval_batch_size
        items = [dataset[i] for i in range(len(dataset))]
        for start in tqdm(range(0, len(items), size), desc="reference log-probs", disable=self.args.disable_tqdm):
            chunk = items[start:start + size]
            inputs = self._prepare_inputs(self.data_collator(chunk))
            sums = self._reference_logps(inputs, labelled_positions(inputs["labels"])).sums.tolist()
            for i, item in enumerate(chunk):
                item["ref_logps"] = sums[i::len(chunk)]

    def loss_and_metrics(self, model, inputs):
        keep = labelled_positions(inputs["labels"])
        policy = forward_logps(model, inputs, keep, self.algorithm.whole_sequence_nll)
        ref = None
        if "ref_logps" in inputs:
            ref = SequenceLogps(inputs["ref_logps"].to(policy.sums), policy.lengths)
        elif self.algorithm.reference:
            ref = self._reference_logps(inputs, keep)
        return self.algorithm.loss(policy, ref, inputs, self.rlhf_args)


class ClassifierTrainer(RLHFTrainer):
    def loss_and_metrics(self, model, inputs):
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False).logits
        return self.algorithm.loss(logits, inputs, self.rlhf_args)


class DistillTrainer(RLHFTrainer):
    def __init__(self, *args, teacher_model, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher = self.frozen(teacher_model)
        self._engines: dict[str, Any] = {}
        self._position = (-1, -1)  # (optimizer step, micro-batch within it) being prepared

    def _draw(self, what: str, per_rank: bool = False) -> random.Random:
        """A random source for this micro-batch, from (seed, optimizer step, micro-batch in the step):
        a resumed run draws what the uninterrupted run drew at the same point. The on/off-policy coin
        is the same on every rank (as TRL's seeded `random`); sampling seeds differ per rank."""
        rank = f":{self.args.process_index}" if per_rank else ""
        return random.Random(f"{self.args.seed}:{self._position[0]}:{self._position[1]}:{what}{rank}")

    def step_batches(self, samples: list[dict]) -> list[dict]:
        """Each micro-batch of the step with the answers it trains on: the dataset's, the teacher's
        (--seq_kd) or, with probability --lmbda, the student's own. Sampled before the step's first
        forward (the weights do not change within a step), so the step's tokens can be counted."""
        out = []
        for micro, inputs in enumerate(samples):
            self._position = (self.state.global_step, micro)
            if self.rlhf_args.seq_kd:  # sequence-level KD: the teacher's answers replace the dataset's
                inputs = self._sampled(inputs, "teacher")
            if self._draw("coin").random() < self.rlhf_args.lmbda:
                inputs = self._sampled(inputs, "student")
            out.append(inputs)
        return out

    def _sampled(self, inputs: dict, by: str) -> dict:
        """The batch's prompts with answers sampled by the student (its own, on-policy) or the teacher
        (--seq_kd), generated with the inference engine."""
        from swift.infer.transformers_engine import TransformersEngine

        a = self.rlhf_args
        model = self.accelerator.unwrap_model(self.model) if by == "student" else self.teacher
        was_training = model.training  # before the engine, which puts its model in eval mode
        if by not in self._engines:
            # the student samples with its adapters on (LoRA), as it is being trained
            adapter = getattr(model, "active_adapter", None) if hasattr(model, "peft_config") else None
            # the run's template (set by the pipeline): its end-of-turn token ends an answer as EOS does
            self._engines[by] = TransformersEngine(model, self.processing_class, template=self.template,
                                                   default_adapter=adapter, inline=True)
        model.eval()
        config = RequestConfig(max_tokens=a.max_completion_length, temperature=a.temperature, top_p=a.top_p,
                               top_k=a.top_k, repetition_penalty=a.repetition_penalty,
                               seed=self._draw(by, per_rank=True).randrange(2 ** 31))
        responses = self._engines[by].infer([InferRequest(input_ids=p) for p in inputs["prompt_ids"]], config)
        model.train(was_training)
        samples = []
        for prompt, response in zip(inputs["prompt_ids"], responses):
            completion = response.choices[0].sampled_token_ids()  # the end token it sampled, if any
            samples.append({"sequences": [(prompt + completion, [IGNORE_INDEX] * len(prompt) + completion)],
                            "prompt_ids": prompt})
        batch = self.data_collator(samples)
        batch["on_policy"] = by == "student"
        return batch

    def loss_and_metrics(self, model, inputs):
        labels = inputs["labels"]
        keep = labelled_positions(labels)
        forward = dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], logits_to_keep=keep,
                       use_cache=False)
        targets = labels[:, 1:][:, keep]
        mask = targets != IGNORE_INDEX
        a = self.rlhf_args
        with_nll = bool(a.sft_alpha) and not inputs.get("on_policy")
        student_head, teacher_head = plain_head(model), plain_head(self.teacher)
        if student_head is not None and teacher_head is not None:
            # hidden states in, the two distributions over the vocabulary a chunk of tokens at a time
            with hidden_states_out(model):
                student = model(**forward).logits[mask]
            with torch.no_grad(), hidden_states_out(self.teacher):
                teacher = self.teacher(**forward).logits[mask]
            jsd, nll = gkd.head_losses(student, student_head, teacher, teacher_head, targets[mask], a.beta, with_nll)
            terms = {"tokens": jsd.sum()}
            metrics = {"jsd": jsd.mean().item() if jsd.numel() else 0.0}
            nll = nll.sum() if with_nll else None
        else:
            student = model(**forward).logits
            with torch.no_grad():
                teacher = self.teacher(**forward).logits
            terms, metrics = self.algorithm.loss(student[mask], teacher[mask], a)
            nll = F.cross_entropy(student[mask].float(), targets[mask], reduction="sum") if with_nll else None
        if nll is not None:  # both are sums over the labelled tokens: a token mean over the step
            terms["tokens"] = terms["tokens"] + a.sft_alpha * nll
            metrics["sft_loss"] = (nll / mask.sum().clamp(min=1)).item()
        metrics["on_policy"] = float(bool(inputs.get("on_policy")))
        return terms, metrics

"""The HF Trainer plus one thin mixin: a loss that computes logits only where labels exist,
and generation-based evaluation (`--predict_with_generate`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import Trainer

from swift.rlhf import logps
from swift.rlhf.logps import head_cross_entropy, hidden_states_out, labelled_positions, plain_head
from swift.template.base import IGNORE_INDEX, Template
from swift.trainers.generate_eval import exact_match_accuracy


def causal_lm_loss(model, inputs: dict, num_items_in_batch: torch.Tensor | int | None) -> torch.Tensor:
    """Next-token cross-entropy, projecting to the vocabulary only at positions that predict a label.

    Prompt tokens carry no loss, so their logits are never needed; `logits_to_keep` (a tensor of
    sequence positions) makes the model skip the output head there, which is most of the work for
    small models with large vocabularies. Where those logits would exceed `CHUNK_ELEMENTS`, models
    with a plain output layer (`plain_head`) never hold them whole: the head and the cross-entropy
    run over chunks of positions (`swift.rlhf.logps.head_cross_entropy`).
    """
    labels = inputs["labels"]
    keep = labelled_positions(labels)  # positions t predicting labels[t+1]
    selected = labels[:, 1:][:, keep]
    model_inputs = {k: v for k, v in inputs.items() if k != "labels"}
    head = plain_head(model)
    if head is not None and selected.numel() * head.out_features > logps.CHUNK_ELEMENTS:  # else one chunk: whole
        with hidden_states_out(model):
            hidden = model(**model_inputs, logits_to_keep=keep, use_cache=False).logits
        loss = head_cross_entropy(hidden, head, selected)
    else:
        logits = model(**model_inputs, logits_to_keep=keep, use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), selected.reshape(-1),
                               ignore_index=IGNORE_INDEX, reduction="sum")
    n = num_items_in_batch if num_items_in_batch is not None else (selected != IGNORE_INDEX).sum().clamp(min=1)
    return loss / n


class SwiftMixin:
    """Mixed into `transformers.Trainer`; set `template` and `generation_rows` for generation eval."""

    template: Template | None = None
    generation_rows: list[dict] | None = None
    generation_max_new_tokens: int = 64
    # compute_loss divides by the step's labelled tokens itself (`_get_num_items_in_batch`): HF must
    # not divide by the accumulation steps again, whatever the model class says of its loss kwargs
    loss_is_scaled_for_ga = True

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> torch.Tensor | None:
        """The tokens that carry loss in the whole optimizer step (`labels[:, 1:]`, as `causal_lm_loss`
        counts them), summed over the ranks. HF counts them only for model classes that accept loss
        kwargs (not e.g. gemma3n's), and over the whole labels for a model whose loss type it does not
        know to shift: before 2026-12-07 such a model's loss was a mean of micro-batch means, so
        --gradient_accumulation_steps and the ranks changed the update."""
        if not batch_samples or "labels" not in batch_samples[0]:
            return None
        n = sum((b["labels"][..., 1:] != IGNORE_INDEX).sum() for b in batch_samples).to(device)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            n = self.accelerator.gather(n).sum()
        return n

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = causal_lm_loss(model, inputs, num_items_in_batch)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes  # DDP averages gradients; the count was global
        return (loss, None) if return_outputs else loss

    _eval_sums: torch.Tensor | None = None  # (token-loss sum, labelled tokens) of the evaluation running

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            total = causal_lm_loss(model, inputs, 1)
        tokens = (inputs["labels"][:, 1:] != IGNORE_INDEX).sum()
        if self._eval_sums is not None:
            self._eval_sums += torch.stack([total.double(), tokens.double()])
        return (total / tokens.clamp(min=1)).detach(), None, None

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):
        """eval_loss is the loss over every labelled token of the evaluation, summed on all ranks,
        whatever --per_device_eval_batch_size or --padding_free (HF averages the batches' own token
        means, weighted by rows: before 2026-11-29 eval_loss moved with the batch size). Rows a
        rank repeats to even out the last batch count once more here (HF drops them)."""
        self._eval_sums = torch.zeros(2, dtype=torch.float64, device=self.args.device)
        try:
            output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                             metric_key_prefix)
            total, tokens = self.accelerator.reduce(self._eval_sums, reduction="sum").tolist()
        finally:
            self._eval_sums = None
        if tokens:
            output.metrics[f"{metric_key_prefix}_loss"] = total / tokens
        return output

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        metrics = {}
        if self.eval_dataset is not None or eval_dataset is not None:
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        if self.args.predict_with_generate and self.generation_rows and self.template is not None:
            acc = exact_match_accuracy(self.accelerator.unwrap_model(self.model), self.template, self.generation_rows,
                                       self.generation_max_new_tokens)
            extra = {f"{metric_key_prefix}_acc": acc}
            self.log(extra)
            metrics.update(extra)
        return metrics


class SwiftTrainer(SwiftMixin, Trainer):
    pass

"""The offline preference trainer: one concatenated forward of chosen and rejected, a reference
forward (a separate model, or the policy with its LoRA adapters disabled), then the algorithm's loss."""
from __future__ import annotations

import contextlib
from collections import defaultdict

import torch
from transformers import Trainer

from swift.rlhf.dpo import dpo_loss
from swift.rlhf.logps import labelled_positions, target_logps


def forward_logps(model, inputs: dict, keep: torch.Tensor):
    """Log-probs of the labels, projecting to the vocabulary only where a label follows (`logits_to_keep`)."""
    logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], logits_to_keep=keep,
                   use_cache=False).logits
    return target_logps(logits, inputs["labels"][:, 1:][:, keep])


class PreferenceTrainer(Trainer):
    def __init__(self, *args, ref_model=None, rlhf_args=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.ref_model = ref_model
        self.rlhf_args = rlhf_args
        if ref_model is not None:
            self.ref_model = ref_model.to(self.args.device).eval().requires_grad_(False)
        self._metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}

    def _reference_logps(self, model, inputs, keep) -> torch.Tensor:
        with torch.no_grad():
            if self.ref_model is not None:
                return forward_logps(self.ref_model, inputs, keep)[0]
            # LoRA: the reference is the same weights without the adapters, not a second copy
            unwrapped = self.accelerator.unwrap_model(model)
            ctx = unwrapped.disable_adapter() if hasattr(unwrapped, "disable_adapter") else contextlib.nullcontext()
            with ctx:
                return forward_logps(model, inputs, keep)[0]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        a = self.rlhf_args
        keep = labelled_positions(inputs["labels"])
        logps, lengths, per_token = forward_logps(model, inputs, keep)
        ref_logps = self._reference_logps(model, inputs, keep)
        n = inputs["labels"].size(0) // 2  # the batch is [chosen..., rejected...]
        loss = dpo_loss(logps[:n], logps[n:], ref_logps[:n], ref_logps[n:], loss_types=a.loss_type,
                        loss_weights=a.loss_weights or None, beta=a.beta, label_smoothing=a.label_smoothing,
                        chosen_len=lengths[:n], rejected_len=lengths[n:])
        if a.rpo_alpha:
            loss = loss + a.rpo_alpha * (-per_token[:n].sum() / lengths[:n].sum().clamp(min=1))
        self._record(logps, ref_logps, n)
        return (loss, None) if return_outputs else loss

    def _record(self, logps: torch.Tensor, ref_logps: torch.Tensor, n: int) -> None:
        mode = "train" if self.model.training else "eval"
        rewards = (self.rlhf_args.beta * (logps - ref_logps)).detach()
        chosen, rejected = rewards[:n], rewards[n:]
        m = self._metrics[mode]
        m["rewards/chosen"].append(chosen.mean().item())
        m["rewards/rejected"].append(rejected.mean().item())
        m["rewards/accuracies"].append((chosen > rejected).float().mean().item())
        m["rewards/margins"].append((chosen - rejected).mean().item())
        m["logps/chosen"].append(logps[:n].detach().mean().item())
        m["logps/rejected"].append(logps[n:].detach().mean().item())

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        prefix = "eval_" if mode == "eval" else ""
        for key, values in self._metrics[mode].items():
            if values:
                logs[prefix + key] = sum(values) / len(values)
        self._metrics[mode].clear()
        super().log(logs, start_time)

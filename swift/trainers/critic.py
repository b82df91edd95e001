"""PPO's learned value function, one part chosen by `--critic_backbone`:

- `separate` (default, as OpenRLHF and verl): a second model, a one-label token-classification
  head on `--critic_model` (default the policy's starting weights), LoRA or full as `--tuner_type`.
- `shared` (TRL's old value-head model): a linear value head on the policy's last hidden state.
  The value loss trains the head and, through it, the policy's own trainable weights; the values
  for the loss come from the policy forward that gives the log-probs, so no second model is run.

Either way the critic's own parameters are extra groups of the trainer's optimizer; their
gradients are averaged over ranks (they are outside DDP) and clipped at `--max_grad_norm` before
each step. Both give values [B, Lc] at the positions that predict each completion token."""
from __future__ import annotations

import abc
import os

import torch
import torch.distributed as dist

from swift.trainers.completion_logps import token_values
from swift.trainers.rlhf import disable_dropout
from swift.utils.registry import SwiftError

CRITIC_DIR = "critic"  # a separate critic at the end of training
VALUE_HEAD = "value_head.safetensors"  # a shared critic's head at the end of training
CRITIC_STATE = "critic.safetensors"  # the trained tensors, in every checkpoint


class Critic(abc.ABC):
    module: torch.nn.Module  # what holds the critic's own parameters

    @abc.abstractmethod
    def values(self, batch: dict, hidden: torch.Tensor | None) -> torch.Tensor:
        """Values [B, Lc] (with gradients where the caller has them on); `hidden`: the last hidden
        states of the policy forward that gave the batch's log-probs, for a critic that needs them."""

    @abc.abstractmethod
    def save_final(self, output_dir: str, tokenizer) -> None:
        """The trained critic at the end of training."""

    needs_hidden = False  # whether values() reads the policy forward's hidden states

    def named_trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def zero_grad(self) -> None:
        self.module.zero_grad(set_to_none=True)

    def reduce_and_clip(self, num_processes: int, max_grad_norm: float | None) -> float | None:
        """Average the critic's gradients over ranks (as DDP does) and clip them; the norm before."""
        params = [p for _, p in self.named_trainable() if p.grad is not None]
        if not params:
            return None
        if num_processes > 1:
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat)
            flat /= num_processes
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        if max_grad_norm and max_grad_norm > 0:
            return torch.nn.utils.clip_grad_norm_(params, max_grad_norm).item()
        return None

    def broadcast(self) -> None:
        """One starting critic on every rank (a fresh head is drawn per rank)."""
        for tensor in self.module.state_dict().values():
            dist.broadcast(tensor, src=0)

    def save_checkpoint(self, output_dir: str) -> None:
        from safetensors.torch import save_file

        save_file({n: p.detach().contiguous() for n, p in self.named_trainable()},
                  os.path.join(output_dir, CRITIC_STATE))

    def load_checkpoint(self, checkpoint: str) -> None:
        from safetensors.torch import load_file

        path = os.path.join(checkpoint, CRITIC_STATE)
        trained = {n for n, _ in self.named_trainable()}
        saved = load_file(path) if os.path.exists(path) else {}
        if set(saved) != trained:
            wrong = sorted(set(saved) ^ trained) or [path]
            raise SwiftError(f"--resume_from_checkpoint {checkpoint}: {CRITIC_STATE} does not hold this run's critic "
                             f"({wrong[0]}); resume with the critic settings it was saved with")
        self.module.load_state_dict(saved, strict=False)


class SeparateCritic(Critic):
    def __init__(self, model: torch.nn.Module, device, no_dropout: bool):
        self.module = model.to(device)
        if no_dropout:
            disable_dropout(self.module)
        self.module.train()

    def values(self, batch, hidden=None):
        return token_values(self.module, batch)

    def save_final(self, output_dir, tokenizer):
        """A model `--critic_model` loads (full), or its adapter and head (LoRA)."""
        self.module.save_pretrained(os.path.join(output_dir, CRITIC_DIR))
        tokenizer.save_pretrained(os.path.join(output_dir, CRITIC_DIR))


class SharedCritic(Critic):
    needs_hidden = True

    def __init__(self, hidden_size: int, device):
        # small random weights (std 1/(H+1), as OpenRLHF's value head), bias 0; rank 0's on every rank
        self.module = torch.nn.Linear(hidden_size, 1).to(device)
        torch.nn.init.normal_(self.module.weight, std=1 / (hidden_size + 1))
        torch.nn.init.zeros_(self.module.bias)

    def values(self, batch, hidden):
        return self.module(hidden.float()).squeeze(-1)

    def save_final(self, output_dir, tokenizer):
        from safetensors.torch import save_file

        save_file({n: p.detach().contiguous() for n, p in self.module.named_parameters()},
                  os.path.join(output_dir, VALUE_HEAD))


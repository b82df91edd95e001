"""Dense process rewards: a process reward model (`swift rlhf --rlhf_type prm`, a token classifier
labelled at the end of each step) scores every step of a sampled completion.

A step ends at each occurrence of `--step_separator` in the completion's tokens; a last step
without one gets the separator appended for scoring, as the model saw every step end in training,
and its reward sits on its last token. A step's reward is the model's probability that it is
correct (label 1). The policy and the PRM must share the tokenizer: the PRM reads the policy's own
token ids.

How the trainers use them:
- PPO: each step's reward is added to the per-token reward at the step's last token (GAE then
  carries it back to the tokens before).
- GRPO (process supervision, DeepSeekMath §4.1.3): the step rewards of a group's completions are
  normalised together, r̃ = (r − mean) / (std + 1e-4), and a token's process advantage is the sum of
  r̃ over the steps that end at or after it; it is added to the outcome advantage (if any reward
  function is given).
"""
from __future__ import annotations

import torch

from swift.utils.registry import SwiftError

Steps = list[tuple[int, float]]  # (index of the step's last token in the completion, reward)


class ProcessRewardModel:
    def __init__(self, path: str, tokenizer, separator: str, device=None, max_batch_size: int = 32):
        from swift.model import load_model
        from swift.model.loader import whole_weights

        with whole_weights():  # scored outside the trainer's forwards, on each rank alone
            model, prm_tokenizer, _ = load_model(path, task_type="token_cls")
        if model.config.num_labels != 2:
            raise SwiftError(f"--prm_model {path} has {model.config.num_labels} labels; a process reward model from "
                             "`swift rlhf --rlhf_type prm` has 2 (step wrong / right)")
        if prm_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise SwiftError(f"--prm_model {path} has another tokenizer than the policy; it must read the policy's "
                             "own tokens (train it from the same base model)")
        self.separator = tokenizer.encode(separator, add_special_tokens=False)
        if not self.separator:
            raise SwiftError(f"--step_separator {separator!r} encodes to no token")
        self.special = set(tokenizer.all_special_ids)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.model = model.eval().requires_grad_(False).to(device or "cpu")
        self.max_batch_size = max_batch_size

    def step_ends(self, completion_ids: list[int]) -> tuple[list[int], list[int], bool]:
        """(the completion's content tokens, the index of each step's last token, whether the last
        step lacks a separator). Content stops at the first special token (the end of the answer)."""
        content = []
        for t in completion_ids:
            if t in self.special:
                break
            content.append(t)
        k = len(self.separator)
        ends = [i + k - 1 for i in range(len(content) - k + 1) if content[i:i + k] == self.separator]
        open_tail = bool(content) and (not ends or ends[-1] < len(content) - 1)
        if open_tail:
            ends.append(len(content) - 1)
        return content, ends, open_tail

    @torch.no_grad()
    def score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[Steps]:
        rows, positions, placed = [], [], []
        for prompt, completion in zip(prompts, completions):
            content, ends, open_tail = self.step_ends(completion)
            ids = list(prompt) + content + (self.separator if open_tail else [])
            at = [len(prompt) + e for e in ends]
            if open_tail:  # scored at the appended separator's last token
                at[-1] = len(ids) - 1
            rows.append(ids)
            positions.append(at)
            placed.append(ends)
        out: list[Steps] = []
        device = next(self.model.parameters()).device
        for start in range(0, len(rows), self.max_batch_size):
            chunk = rows[start:start + self.max_batch_size]
            width = max(len(r) for r in chunk)
            ids = torch.full((len(chunk), width), self.pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, r in enumerate(chunk):
                ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r, dtype=torch.long), 1
            probs = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float().softmax(-1)
            for i in range(len(chunk)):
                row = start + i
                good = probs[i, positions[row], 1].tolist() if positions[row] else []
                out.append(list(zip(placed[row], good)))
        return out


def process_advantages(steps: list[Steps], num_generations: int, width: int, eps: float = 1e-4) -> torch.Tensor:
    """[rows, width]: each token's sum of the group-normalised rewards of the steps ending at or after it."""
    out = torch.zeros(len(steps), width)
    for g in range(0, len(steps), num_generations):
        rewards = torch.tensor([r for row in steps[g:g + num_generations] for _, r in row], dtype=torch.float32)
        if rewards.numel() == 0:
            continue
        mean = rewards.mean()
        std = rewards.std() if rewards.numel() > 1 else torch.tensor(0.0)
        for i in range(g, min(g + num_generations, len(steps))):
            for end, r in steps[i]:
                if end < width:
                    out[i, :end + 1] += (r - mean) / (std + eps)
    return out

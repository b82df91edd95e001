"""Score answers with a process reward model (`swift rlhf --rlhf_type prm`): the probability that each
step is correct, read at the token that ends it, exactly where the PRM was trained to label."""
from __future__ import annotations

import threading

import torch

from swift.template.base import Template


class PRMScorer:
    def __init__(self, path: str, *, step_separator: str = "\n", template_name: str | None = None,
                 max_length: int = 2048):
        from swift.model import load_model
        from swift.template import get_template, infer_template

        model, tokenizer, info = load_model(path, task_type="token_cls", num_labels=2)
        self.model = model.eval()
        self.template: Template = get_template(template_name or infer_template(info.model_type, tokenizer), tokenizer)
        self.separator, self.max_length = step_separator, max_length
        self._lock = threading.Lock()

    def steps(self, response: str) -> list[str]:
        return [s for s in response.split(self.separator) if s.strip()]

    @torch.inference_mode()
    def step_scores(self, messages: list[dict], response: str) -> list[float]:
        """P(correct) of each step of `response` to the conversation `messages` (as `encode_steps`
        lays a step-labelled row out: the prompt, then each step followed by the separator)."""
        ids = self.template.encode_prompt(messages)
        ends = []
        for step in self.steps(response):
            ids = ids + self.template.tokenizer.encode(step + self.separator, add_special_tokens=False)
            if len(ids) > self.max_length:
                break
            ends.append(len(ids) - 1)
        if not ends:
            return []
        device = next(self.model.parameters()).device
        with self._lock:
            logits = self.model(input_ids=torch.tensor([ids], device=device)).logits[0]
        return logits[ends].float().softmax(-1)[:, 1].tolist()

    def score(self, messages: list[dict], response: str) -> float:
        """The weakest step decides (Math-Shepherd's aggregation): the minimum step probability; 0
        for an answer with no step."""
        scores = self.step_scores(messages, response)
        return min(scores) if scores else 0.0

"""Score texts or conversations with a sequence-classification (reward) model."""
from __future__ import annotations

import threading

import torch

from swift.serving.jobs import JobControl
from swift.template.base import Template


class RewardScorer:
    """`score(texts)` → one float per text: the value head's output at the last real token."""

    def __init__(self, model, tokenizer, template: Template, *, max_batch_size: int = 32, max_length: int = 2048):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.template = template
        self.max_batch_size = max_batch_size
        self.max_length = max_length
        self._lock = threading.Lock()  # one forward at a time; requests come from a thread pool

    def render(self, messages: list[dict]) -> str:
        return self.template.render(self.template.with_system(messages))[0]

    @torch.inference_mode()
    def score(self, texts: list[str], control: JobControl | None = None) -> list[float]:
        """`control` (a server's job): its deadline or cancellation stops the scoring before the
        next batch with JobStopped, so a request nobody waits for frees the scorer."""
        device = next(self.model.parameters()).device
        out: list[float] = []
        with self._lock:
            for start in range(0, len(texts), self.max_batch_size):
                if control is not None:
                    control.check()
                enc = self.tokenizer(texts[start:start + self.max_batch_size], add_special_tokens=False, padding=True,
                                     truncation=True, max_length=self.max_length, return_tensors="pt").to(device)
                logits = self.model(**enc).logits
                out += logits[:, 0].float().tolist()
        return out

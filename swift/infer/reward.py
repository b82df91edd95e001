"""Score texts or conversations with a sequence-classification (reward) model."""
from __future__ import annotations

import threading

import torch

from swift.infer.protocol import fit_length
from swift.serving.jobs import JobControl
from swift.template.base import Template
from swift.utils.registry import SwiftError


class RewardScorer:
    """`score(texts)` → one float per text: the value head's output at the last real token."""

    def __init__(self, model, tokenizer, template: Template, *, max_batch_size: int = 32, max_length: int = 2048,
                 truncation: str = "right"):
        """A text longer than `max_length` tokens is cut ("right" keeps its start, "left" its end) or
        refused before anything is scored ("delete", `swift deploy`'s default)."""
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.template = template
        self.max_batch_size = max_batch_size
        self.max_length = max_length
        self.truncation = truncation
        self._lock = threading.Lock()  # one forward at a time; requests come from a thread pool

    def render(self, messages: list[dict]) -> str:
        return self.template.render_text(self.template.with_system(messages))

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text within --max_length; a SwiftError naming the first text refused."""
        out = []
        for i, ids in enumerate(self.tokenizer(texts, add_special_tokens=False)["input_ids"]):
            try:
                out.append(fit_length(ids, self.max_length, self.truncation, "text"))
            except SwiftError as e:
                raise SwiftError(f"text {i}: {e}") from None
        return out

    @torch.inference_mode()
    def score(self, texts: list[str], control: JobControl | None = None) -> list[float]:
        """`control` (a server's job): its deadline or cancellation stops the scoring before the
        next batch with JobStopped, so a request nobody waits for frees the scorer."""
        device = next(self.model.parameters()).device
        rows = self.encode(texts)
        out: list[float] = []
        with self._lock:
            for start in range(0, len(rows), self.max_batch_size):
                if control is not None:
                    control.check()
                enc = self.tokenizer.pad({"input_ids": rows[start:start + self.max_batch_size]},
                                         return_tensors="pt").to(device)
                logits = self.model(**enc).logits
                out += logits[:, 0].float().tolist()
        return out

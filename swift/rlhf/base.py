"""The algorithm registry. Shared code looks an algorithm up here and never branches on its name."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from swift.utils.registry import Registry


@dataclass(frozen=True)
class Algorithm:
    """What an offline algorithm needs from the shared trainer path.

    trainer: "preference" (sequence log-probs of a causal LM), "classifier" (a value head's logits),
        "distill" (student and teacher next-token distributions) or "rollout" (online RL: sample,
        score, update).
    data: how a row becomes sequences: "pair" (chosen + rejected), "unpaired" (one completion and a
        mismatched one for the KL baseline), "steps" (step-labelled solutions), "conversation",
        "prompt" (a prompt and its other columns, for online RL).
    loss: returns (loss, metrics); its inputs depend on the trainer:
        preference: `loss(policy, ref, batch, args)` with `SequenceLogps` (ref None without a reference);
        classifier: `loss(logits, batch, args)`; distill: `loss(student_logits, teacher_logits, args)`
        (the logits of the labelled positions only); rollout: `swift.rlhf.grpo.policy_loss`.
    defaults: default argument values (e.g. beta) that the user did not set.
    whole_sequence_nll: the preference trainer also sums log-probs over every token (prompt included).
    critic: online RL with a learned value model (PPO): per-token advantages by GAE.
    """

    trainer: str
    data: str
    loss: Callable
    reference: bool = False
    task_type: str = "causal_lm"
    num_labels: int | None = None
    defaults: dict = field(default_factory=dict)
    loss_types: Registry | None = None
    whole_sequence_nll: bool = False
    critic: bool = False


ALGORITHMS: Registry[Algorithm] = Registry("rlhf algorithm")

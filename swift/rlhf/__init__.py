"""Preference alignment and distillation: one file per algorithm, its loss as pure tensor functions
plus one `ALGORITHMS` entry saying what data, model head, reference and trainer it needs."""
from swift.rlhf.base import ALGORITHMS, Algorithm
from swift.rlhf import cpo, dpo, gkd, grpo, kto, orpo, ppo, prm, rm, simpo  # noqa: F401  (each registers itself)
from swift.rlhf import harmless  # noqa: F401,E402  (online RL's last: refusals list grpo, ppo first)

__all__ = ["ALGORITHMS", "Algorithm"]

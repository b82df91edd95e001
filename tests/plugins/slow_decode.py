"""A test plugin that makes every decode step of the built-in engine take at least 20 ms, so a test
that needs a request to outlive a timeout gets one on any CPU, however fast (240 tokens: ≥ 4.8 s)."""
import time

from swift.infer.transformers_engine import TransformersEngine

STEP_SECONDS = 0.02
_sample_step = TransformersEngine._sample_step


def _slow_sample_step(self, *args, **kwargs):
    time.sleep(STEP_SECONDS)
    return _sample_step(self, *args, **kwargs)


TransformersEngine._sample_step = _slow_sample_step

"""A test plugin that makes every decode step of the built-in engine take at least 20 ms (or
SWIFT_TEST_STEP_SECONDS), so a test that needs a request to outlive a timeout gets one on any CPU,
however fast (240 tokens: ≥ 4.8 s)."""
import os
import time

from swift.infer.transformers_engine import TransformersEngine

STEP_SECONDS = float(os.environ.get("SWIFT_TEST_STEP_SECONDS", "0.02"))
_sample_step = TransformersEngine._sample_step


def _slow_sample_step(self, *args, **kwargs):
    time.sleep(STEP_SECONDS)
    return _sample_step(self, *args, **kwargs)


TransformersEngine._sample_step = _slow_sample_step

if os.environ.get("SWIFT_TEST_NO_EOS"):  # every row runs to max_tokens unless it is stopped
    _init = TransformersEngine.__init__

    def _init_without_eos(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        self.eos_ids = set()

    TransformersEngine.__init__ = _init_without_eos

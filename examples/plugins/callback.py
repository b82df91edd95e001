"""A trainer callback: stop training once the logged loss falls below a threshold.

    swift sft --external_plugins examples/plugins/callback.py --callbacks stop_at_loss ...

A callback is a transformers.TrainerCallback subclass; it is built with the trainer when its
__init__ takes a `trainer` argument, otherwise with no arguments.
"""
import os

from transformers import TrainerCallback

from swift.plugin import register


@register("callback", "stop_at_loss")
class StopAtLoss(TrainerCallback):
    def __init__(self, trainer):
        self.trainer = trainer
        self.threshold = float(os.environ.get("STOP_AT_LOSS", "1.0"))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and logs.get("loss", float("inf")) < self.threshold:
            control.should_training_stop = True

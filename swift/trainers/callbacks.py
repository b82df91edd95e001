"""Trainer callbacks: logging.jsonl, PNG curves, args.json inside checkpoints."""
from __future__ import annotations

import json
import os
import shutil
import time

from transformers import TrainerCallback

from swift.utils.io import append_jsonl, write_jsonl
from swift.utils.registry import Registry
from swift.trainers.plots import plot_logs

CALLBACKS: Registry[type[TrainerCallback]] = Registry("callback")


def build_callback(name: str, trainer) -> TrainerCallback:
    """A `--callbacks` entry: its class, given the trainer when its __init__ asks for one."""
    import inspect

    cls = CALLBACKS.get(name)
    takes_trainer = "trainer" in inspect.signature(cls.__init__).parameters
    return cls(trainer=trainer) if takes_trainer else cls()


class JsonlLogCallback(TrainerCallback):
    """One JSON line per log event in `<output_dir>/logging.jsonl`; PNG curves in `images/` at the end."""

    def __init__(self, output_dir: str):
        self.path = os.path.join(output_dir, "logging.jsonl")
        self.images = os.path.join(output_dir, "images")
        self.start = time.time()

    def on_train_begin(self, args, state, control, **kwargs):
        """Resumed in the same directory: the lines logged after the checkpoint go (they are logged
        again), so each step appears once (before 2026-11-29 they were repeated)."""
        if not (state.is_world_process_zero and state.global_step and os.path.exists(self.path)):
            return
        kept = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut short when the run was stopped
                    continue
                if row.get("global_step", 0) <= state.global_step:
                    kept.append(row)
        write_jsonl(self.path + ".tmp", kept)  # then moved over it: a kill now never loses the log
        os.replace(self.path + ".tmp", self.path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            row = {"global_step": state.global_step, "max_steps": state.max_steps,
                   "epoch": round(state.epoch or 0.0, 4), **logs, "elapsed_s": round(time.time() - self.start, 2)}
            append_jsonl(self.path, row)

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            plot_logs(state.log_history, self.images)


class ArgsInCheckpointCallback(TrainerCallback):
    """Copy args.json into each checkpoint so a checkpoint (or adapter) knows how it was made."""

    def __init__(self, args_path: str):
        self.args_path = args_path

    def on_save(self, args, state, control, **kwargs):
        ckpt = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if state.is_world_process_zero and os.path.isdir(ckpt) and os.path.isfile(self.args_path):
            shutil.copy(self.args_path, os.path.join(ckpt, "args.json"))

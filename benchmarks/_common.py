"""Shared parts of the benchmark scripts: the settings pinned on both sides, timing that skips
warm-up steps, and the configuration block each script prints next to its figures."""
from __future__ import annotations

import os
import platform
import time

import torch
from transformers import TrainerCallback

CPU = not torch.cuda.is_available()
# fp32 on CPU; bf16 weights and autocast on a GPU that has it (swift's `--torch_dtype auto`)
DTYPE = "bfloat16" if not CPU and torch.cuda.is_bf16_supported() else "float32"


def trainer_settings(**overrides) -> dict:
    """Hugging Face `TrainingArguments` given identically to swift and to TRL. Each is named even
    where it is the default of both, so the printed configuration is complete; the ones whose
    defaults differ are marked."""
    return dict(
        gradient_checkpointing=False,  # TRL 1.16 default True, swift (HF) False
        bf16=DTYPE == "bfloat16",  # TRL default None → True (bf16 autocast, on CPU too), swift False in fp32
        fp16=False,
        lr_scheduler_type="cosine",  # swift default cosine, TRL (HF) linear
        logging_steps=1,  # swift default 5, TRL 10
        optim="adamw_torch_fused", weight_decay=0.0, max_grad_norm=1.0, warmup_steps=0,
        gradient_accumulation_steps=1, seed=42, dataloader_num_workers=0,
        dataloader_pin_memory=not CPU,  # swift turns pinning off on CPU
        use_cpu=CPU, torch_compile=False, report_to="none", save_strategy="no", disable_tqdm=True,
        **overrides,
    )


class StepTimer(TrainerCallback):
    """Wall time of the steps after the first `warmup` ones: from the end of step `warmup` to the
    end of the last step (so start-up, warm-up and the end-of-training work are outside it)."""

    def __init__(self, warmup: int):
        self.warmup, self.marks = warmup, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.marks = [time.perf_counter()]

    def on_step_end(self, args, state, control, **kwargs):
        self.marks.append(time.perf_counter())

    @property
    def steps(self) -> int:
        return len(self.marks) - 1 - self.warmup

    @property
    def seconds(self) -> float:
        return self.marks[-1] - self.marks[self.warmup]


class TokenCounter:
    """Wraps a collator and records the real (non-pad) input tokens of every batch it makes."""

    def __init__(self, collator, pad_id: int):
        self.collator, self.pad_id, self.counts = collator, pad_id, []

    def __call__(self, batch):
        out = self.collator(batch)
        self.counts.append(int((out["input_ids"] != self.pad_id).sum()))
        return out

    def timed(self, timer: StepTimer) -> int:
        """Tokens of the timed steps (one batch per step: gradient accumulation is 1)."""
        return sum(self.counts[timer.warmup:timer.warmup + timer.steps])


def add_callback(pipeline, callback) -> None:
    """Make a swift pipeline's trainer carry `callback` (the pipeline builds the trainer in run())."""
    base = pipeline.trainer_cls

    class Trainer(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(callback)

    pipeline.trainer_cls = Trainer


RESOLVED = ("gradient_checkpointing", "bf16", "fp16", "optim", "learning_rate", "lr_scheduler_type", "warmup_steps",
            "weight_decay", "max_grad_norm", "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps",
            "seed", "logging_steps", "dataloader_num_workers", "torch_compile")


def resolved(trainer) -> dict:
    """What a finished trainer actually ran with (read back, not what was asked for)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    out = {k: getattr(trainer.args, k) for k in RESOLVED}
    out["optim"] = str(out["optim"]).split(".")[-1].lower()
    out["lr_scheduler_type"] = str(out["lr_scheduler_type"]).split(".")[-1].lower()
    out["model gradient checkpointing"] = bool(getattr(model, "is_gradient_checkpointing", False))
    out["model dtype"] = str(model.dtype).replace("torch.", "")
    out["attention"] = model.config._attn_implementation
    return out


def environment() -> str:
    import transformers

    try:
        import trl
        versions = f"transformers {transformers.__version__}, trl {trl.__version__}"
    except ImportError:
        versions = f"transformers {transformers.__version__}"
    device = f"{torch.cuda.get_device_name()}" if not CPU else f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    return f"{device}; torch {torch.__version__}, {versions}; torch threads {torch.get_num_threads()}"


def fmt(settings: dict | str) -> str:
    if isinstance(settings, str):
        return f"`{settings}`"
    return ", ".join(f"`{k}={v!r}`" for k, v in settings.items())


def print_config(shared: dict, sides: dict[str, dict | str], notes: list[str] = (),
                 resolved_by_side: dict[str, dict] | None = None) -> None:
    """Markdown for docs/benchmarks.md: the environment, the settings given to both sides, each
    side's own settings, what each trainer resolved at run time, and notes."""
    print("\nConfiguration:\n")
    print(f"- machine: {environment()}")
    if shared:
        print(f"- both sides (`TrainingArguments` fields): {fmt(shared)}")
    for name, settings in sides.items():
        print(f"- {name}: {fmt(settings)}")
    for note in notes:
        print(f"- {note}")
    if resolved_by_side:
        names = list(resolved_by_side)
        print(f"\n| resolved at run time | {' | '.join(names)} |")
        print(f"|---|{'---|' * len(names)}")
        for key in next(iter(resolved_by_side.values())):
            print(f"| {key} | {' | '.join(str(resolved_by_side[n].get(key)) for n in names)} |")


def take_turns(runners: dict, repeats: int) -> dict[str, list]:
    """Each runner called with the built-in tiny model saved as a local directory, the runners
    taking turns `repeats` times (a slow spell of a shared machine then hits every side alike);
    returns each runner's results in order."""
    import tempfile

    from swift.model import load_model

    runs: dict[str, list] = {name: [] for name in runners}
    with tempfile.TemporaryDirectory() as model_dir:
        model, tokenizer, _ = load_model("builtin:tiny-chat")
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        for _ in range(repeats):
            for name, run in runners.items():
                runs[name].append(run(model_dir))
    return runs

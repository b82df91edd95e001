"""Benchmarks during training (ms-swift's `--eval_use_evalscope` switch and its `eval_*` flags)."""
from __future__ import annotations

from dataclasses import dataclass, field

from swift.utils.registry import SwiftError


@dataclass
class TrainEvalArguments:
    eval_use_evalscope: bool = field(default=False, metadata={
        "help": "At every --eval_steps (and at the end) score the model on --eval_dataset benchmarks with the "
                "built-in evaluator of `swift eval`; metrics go to logging.jsonl, TensorBoard and the PNG curves."})
    eval_dataset: list[str] = field(default_factory=list, metadata={
        "help": "Benchmarks for --eval_use_evalscope (gsm8k, math500, cmath, arith, general_qa, general_mcq, or files); "
                "validation data is --val_dataset."})
    eval_dataset_args: str | None = field(default=None, metadata={"help": "JSON {benchmark: {local_path, subset_list, prompt_template}}."})
    eval_limit: int | None = field(default=None, metadata={"help": "Questions per benchmark (the first N)."})
    eval_generation_config: str | None = field(default=None, metadata={
        "help": "JSON: max_tokens, temperature (default 0), top_p, top_k, n, seed, stop."})

    def __post_init__(self) -> None:
        from swift.pipelines.eval import GENERATION_KEYS, json_flag

        if isinstance(self.eval_dataset, str):
            self.eval_dataset = [self.eval_dataset]
        if self.eval_dataset and not self.eval_use_evalscope:
            raise SwiftError("--eval_dataset names benchmarks scored during training and needs --eval_use_evalscope "
                             "true, as in ms-swift (validation data is --val_dataset)")
        if self.eval_use_evalscope and not self.eval_dataset:
            raise SwiftError("--eval_use_evalscope needs --eval_dataset (e.g. gsm8k, arith, or a jsonl/csv file)")
        for flag in ("eval_limit", "eval_dataset_args", "eval_generation_config"):
            if getattr(self, flag) is not None and not self.eval_use_evalscope:
                raise SwiftError(f"--{flag} shapes the benchmarks scored during training; it needs "
                                 "--eval_use_evalscope and --eval_dataset")
        if self.eval_limit is not None and self.eval_limit < 1:
            raise SwiftError("--eval_limit must be at least 1")
        self.dataset_args = json_flag(self.eval_dataset_args, "--eval_dataset_args")
        self.generation = json_flag(self.eval_generation_config, "--eval_generation_config")
        unknown = set(self.generation) - GENERATION_KEYS
        if unknown:
            raise SwiftError(f"--eval_generation_config: unknown key {sorted(unknown)[0]!r} "
                             f"(known: {', '.join(sorted(GENERATION_KEYS))})")

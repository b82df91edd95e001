"""Benchmarks scored during training (`--eval_use_evalscope`): at every eval step and at the end,
the policy answers each benchmark's questions through an in-process engine, each rank a share of
them (so no rank idles past the process group's timeout while another generates), and the scores
are gathered."""
from __future__ import annotations

import math
from dataclasses import replace

from transformers import Trainer, TrainerCallback

from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)


class BenchmarkCallback(TrainerCallback):
    def __init__(self, trainer, template, eval_args, eval_steps: int, use_hf: bool = False, strict: bool = False):
        from swift.eval.benchmarks import load_questions
        from swift.infer.protocol import RequestConfig
        from swift.pipelines.eval import with_generation

        self.trainer, self.template, self.eval_steps = trainer, template, eval_steps
        # greedy; without a length, at most 512 new tokens (within the model's context)
        self.config, explicit = with_generation(RequestConfig(temperature=0.0), eval_args.generation)
        self.max_tokens = self.config.max_tokens if explicit else 512
        self.benchmarks = {name: load_questions(name, args=eval_args.dataset_args.get(name), use_hf=use_hf,
                                                limit=eval_args.eval_limit, strict=strict)[:2]
                           for name in eval_args.eval_dataset}  # read before training starts: bad input stops it

    def on_train_begin(self, args, state, control, **kwargs):
        steps = self.eval_steps or 1  # HF's convention: below 1, a fraction of the run's steps
        self.every = max(math.ceil(steps * state.max_steps) if steps < 1 else int(steps), 1)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0 or state.global_step >= state.max_steps:
            metrics = self.score(self.trainer.accelerator.unwrap_model(self.trainer.model))
            should_log = control.should_log
            # HF's own log: a trainer's override (DPO, GRPO) would take its accumulated training
            # metrics into this row and clear them from the step's loss row
            Trainer.log(self.trainer, metrics)
            control.should_log = should_log  # logging our row cleared it: the step's loss row still follows

    def score(self, model) -> dict[str, float]:
        from swift.eval.benchmarks import score
        from swift.eval.metrics import summarize
        from swift.infer.protocol import InferRequest
        from swift.infer.transformers_engine import TransformersEngine
        from swift.pipelines.eval import generate
        from swift.pipelines.infer import fit_to_context

        accelerator = self.trainer.accelerator
        rank, world = accelerator.process_index, accelerator.num_processes
        training = model.training
        adapter = getattr(model, "active_adapter", None) if hasattr(model, "peft_config") else None
        engine = TransformersEngine(model, self.template.tokenizer, self.template, default_adapter=adapter,
                                    max_batch_size=32)

        def fit(request, config):  # the rest of the context, at most max_tokens
            request, fitted = fit_to_context(engine, request, config, None)
            return request, replace(fitted, max_tokens=min(fitted.max_tokens, self.max_tokens))

        metrics = {}
        try:
            for name, (bench, questions) in self.benchmarks.items():
                mine = list(range(rank, len(questions), world))  # this rank's share
                try:
                    requests = [InferRequest(messages=questions[i].messages) for i in mine]
                    responses = generate(engine, requests, self.config, False, desc=f"benchmark {name}", fit=fit)
                    local = {i: [0.0] * self.config.n if isinstance(r, Exception) else
                             [score(bench.kind, c.text, questions[i].gold, **questions[i].extra) for c in r.choices]
                             for i, r in zip(mine, responses)}
                    failure = None
                except Exception as e:  # every rank must reach the gather below, or the others wait
                    local, failure = {}, f"rank {rank}: {type(e).__name__}: {e}"
                parts = [(local, failure)]
                if world > 1:
                    from accelerate.utils import gather_object

                    parts = gather_object(parts)
                failures = [f for _, f in parts if f]
                if failures:
                    raise SwiftError(f"benchmark {name} during training failed on {failures[0]}")
                local = {i: v for part, _ in parts for i, v in part.items()}
                scores = [local[i] for i in range(len(questions))]
                logger.info(f"benchmark {name}: {len(questions)} questions answered by {world} rank(s) "
                            f"({', '.join(str(len(part)) for part, _ in parts)})")
                # ms-swift's names: test_<benchmark> (accuracy), then test_<benchmark>_pass@k ...
                metrics.update({f"test_{name}" if k == "acc" else f"test_{name}_{k}": v
                                for k, v in summarize(scores).items()})
        finally:
            engine.close()
            model.train(training)
        logger.info("benchmarks: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        return metrics

"""Benchmarks scored during training (`--eval_use_evalscope`): at every eval step and at the end,
the policy answers each benchmark's questions through an in-process engine on rank 0."""
from __future__ import annotations

from transformers import TrainerCallback

from swift.utils.logging import get_logger

logger = get_logger(__name__)


class BenchmarkCallback(TrainerCallback):
    def __init__(self, trainer, template, eval_args, eval_steps: int, use_hf: bool = False, strict: bool = False):
        from swift.eval.benchmarks import load_questions
        from swift.infer.protocol import RequestConfig
        from swift.pipelines.eval import with_generation

        self.trainer, self.template, self.eval_steps = trainer, template, max(int(eval_steps), 1)
        self.config, self.explicit = with_generation(RequestConfig(temperature=0.0), eval_args.generation)  # greedy
        self.benchmarks = {name: load_questions(name, args=eval_args.dataset_args.get(name), use_hf=use_hf,
                                                limit=eval_args.eval_limit, strict=strict)[:2]
                           for name in eval_args.eval_dataset}  # read before training starts: bad input stops it
        self._done_at = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.eval_steps == 0 or state.global_step >= state.max_steps:
            self.run(state.global_step)

    def run(self, step: int) -> dict[str, float]:
        if self._done_at == step:
            return {}
        self._done_at = step
        trainer = self.trainer
        metrics = {}
        if trainer.accelerator.is_main_process:
            metrics = self.score(trainer.accelerator.unwrap_model(trainer.model))
            trainer.log(metrics)
        trainer.accelerator.wait_for_everyone()
        return metrics

    def score(self, model) -> dict[str, float]:
        from swift.eval.benchmarks import score
        from swift.eval.metrics import summarize
        from swift.infer.protocol import InferRequest
        from swift.infer.transformers_engine import TransformersEngine
        from swift.pipelines.eval import generate
        from swift.pipelines.infer import fit_to_context

        training = model.training
        adapter = getattr(model, "active_adapter", None) if hasattr(model, "peft_config") else None
        engine = TransformersEngine(model, self.template.tokenizer, self.template, default_adapter=adapter,
                                    max_batch_size=32)
        metrics = {}
        try:
            for name, (bench, questions) in self.benchmarks.items():
                requests = [InferRequest(messages=q.messages) for q in questions]
                responses = generate(engine, requests, self.config, self.explicit, desc=f"benchmark {name}",
                                     fit=lambda r, c: fit_to_context(engine, r, c, None))
                scores = [[0.0] * self.config.n if isinstance(r, Exception) else
                          [score(bench.kind, c.text, q.gold) for c in r.choices] for q, r in zip(questions, responses)]
                # ms-swift's names: test_<benchmark> (accuracy), then test_<benchmark>_pass@k ...
                metrics.update({f"test_{name}" if k == "acc" else f"test_{name}_{k}": v
                                for k, v in summarize(scores).items()})
        finally:
            engine.close()
            model.train(training)
        logger.info("benchmarks: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        return metrics

"""`swift eval` questions/s on GSM8K vs a plain batched `model.generate` loop over the same prompts.

    python benchmarks/eval_throughput.py [--data ../shared/data/gsm8k_test.jsonl] [--questions 200]
        [--max_tokens 128] [--batch_size 32] [--warmup 1] [--repeats 2] [--backends transformers,url,vllm]

Every side answers the same `--questions` GSM8K test questions (the chat template's prompt, greedy,
at most `--max_tokens` new tokens, stopping at EOS) and scores them with the same math-verify
scorer, so the work is identical and the answers must agree; the time covers generation, decoding
and scoring, not loading the model. Sides:
- baseline: the prompts in left-padded batches of `--batch_size`, one `model.generate` call each
  (greedy, `use_cache`), as one would write it by hand with transformers;
- transformers: `swift eval`'s evaluator with the built-in engine in this process (its batches
  also hold up to `--batch_size` sequences);
- url: `swift eval --eval_url` against a `swift deploy` process of the same model (HTTP, `--batch_size`
  requests in flight), the server started and warmed up before timing;
- vllm: `--infer_backend vllm` (only where vLLM imports, e.g. the vLLM environment).
Each side runs `--warmup` untimed passes, then `--repeats` timed ones; the median is reported.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks._common import DTYPE, print_config  # noqa: E402
from swift.eval.benchmarks import load_questions, score  # noqa: E402
from swift.infer.protocol import InferRequest, RequestConfig  # noqa: E402
from swift.pipelines.eval import generate  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(fn, warmup: int, repeats: int) -> tuple[float, list]:
    for _ in range(warmup):
        fn()
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:tiny-chat")
    p.add_argument("--data", default=os.path.join(HERE, "..", "..", "shared", "data", "gsm8k_test.jsonl"))
    p.add_argument("--questions", type=int, default=200)
    p.add_argument("--max_tokens", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--backends", default="transformers,url,vllm")
    a = p.parse_args()
    from swift.model import load_model
    from swift.template import get_template, infer_template

    bench, questions, _ = load_questions("gsm8k", args={"local_path": a.data}, limit=a.questions)
    model, tokenizer, info = load_model(a.model, torch_dtype=DTYPE, attn_impl="sdpa")
    model.eval()
    template = get_template(infer_template(info.model_type, tokenizer), tokenizer)
    prompts = [template.encode_prompt(q.messages) for q in questions]
    config = RequestConfig(max_tokens=a.max_tokens, temperature=0.0)
    gen_eos = model.generation_config.eos_token_id  # the engine stops at these and the tokenizer's
    eos = sorted({tokenizer.eos_token_id, *(gen_eos if isinstance(gen_eos, list) else [gen_eos])} - {None})

    def grade(texts: list[str]) -> list[str]:
        for t, q in zip(texts, questions):
            score(bench.kind, t, q.gold)
        return texts

    tokenizer.padding_side = "left"

    def baseline() -> list[str]:
        texts = []
        with torch.inference_mode():
            for start in range(0, len(prompts), a.batch_size):
                batch = tokenizer.pad({"input_ids": prompts[start:start + a.batch_size]}, return_tensors="pt")
                out = model.generate(**batch, do_sample=False, max_new_tokens=a.max_tokens, use_cache=True,
                                     pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)
                texts += tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        return grade(texts)

    def evaluator(engine):
        requests = [InferRequest(messages=q.messages) for q in questions]

        def run() -> list[str]:
            responses = generate(engine, requests, config, True, desc="eval")
            return grade([r.choices[0].text for r in responses])
        return run

    rows = []
    base_s, base_texts = timed(baseline, a.warmup, a.repeats)
    rows.append(("plain batched model.generate", base_s, None))
    backends = a.backends.split(",")
    if "transformers" in backends:
        from swift.infer.transformers_engine import TransformersEngine

        engine = TransformersEngine(model, tokenizer, template, max_batch_size=a.batch_size)
        s, texts = timed(evaluator(engine), a.warmup, a.repeats)
        engine.close()
        rows.append(("swift eval, built-in engine", s, sum(x == y for x, y in zip(texts, base_texts))))
    if "url" in backends:
        sys.path.insert(0, os.path.join(HERE, ".."))
        from swift.infer.client import ClientEngine
        from tests.deploy.serving import deploy

        model_dir = a.model
        if model_dir.startswith("builtin:"):
            from swift.model.loader import builtin_dir

            model_dir = builtin_dir(model_dir)
        with deploy("--model", model_dir, "--torch_dtype", DTYPE, "--max_batch_size", str(a.batch_size)) as base:
            client = ClientEngine(base + "/v1", concurrency=a.batch_size)
            s, texts = timed(evaluator(client), a.warmup, a.repeats)
        rows.append(("swift eval --eval_url (swift deploy)", s, sum(x == y for x, y in zip(texts, base_texts))))
    if "vllm" in backends:
        try:
            import vllm  # noqa: F401
        except ImportError:
            print("vllm: not importable here; run this script in the vLLM environment for that row")
        else:
            from swift.infer.vllm_engine import VllmEngine
            from swift.model.loader import builtin_dir

            model_dir = builtin_dir(a.model) if a.model.startswith("builtin:") else a.model
            engine = VllmEngine(model_dir, tokenizer, template, dtype=DTYPE, gpu_memory_utilization=0.2,
                                max_batch_size=a.batch_size)
            s, texts = timed(evaluator(engine), a.warmup, a.repeats)
            engine.close()
            rows.append(("swift eval, vLLM engine", s, sum(x == y for x, y in zip(texts, base_texts))))
    print_config({"model": a.model, "dtype": DTYPE, "questions": len(questions), "max_new_tokens": a.max_tokens,
                  "decoding": "greedy, stop at EOS", "batch_size": a.batch_size, "threads": torch.get_num_threads(),
                  "warmup": a.warmup, "repeats": a.repeats, "timed": "generation + decoding + math-verify scoring"},
                 {"baseline": "model.generate(do_sample=False, use_cache=True) per left-padded batch",
                  "swift eval": "swift.pipelines.eval.generate over the engine (built-in: one process; url: "
                                "swift deploy on loopback, batch_size requests in flight; vllm: VllmEngine)"})
    print("| side | s (median) | questions/s | speed vs baseline | answers equal to baseline |")
    print("|---|---|---|---|---|")
    for name, s, same in rows:
        print(f"| {name} | {s:.2f} | {len(questions) / s:.1f} | {base_s / s:.2f}x | "
              f"{'-' if same is None else f'{same}/{len(questions)}'} |")


if __name__ == "__main__":
    main()

"""TransformersEngine vs batched `model.generate`: generated tokens/s on the same requests.

    python benchmarks/infer_throughput.py [--requests 8] [--max_tokens 64] [--n 4] [--warmup 1] [--repeats 3]

The baseline is Hugging Face's own way to generate offline for many prompts: every request in
one left-padded batch, one `model.generate` call with `num_return_sequences=n`. The engine gets
the same requests in one `infer` call. Same model object and prompt tokens; both sample at
temperature 1 with no top-k and top-p 1 (generate's default `top_k=50` is switched off), and EOS
is banned on both sides so every sample is `max_tokens` long. Each side makes `--warmup` untimed
calls of the full workload, then `--repeats` timed calls; the two sides take turns.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks._common import DTYPE, print_config  # noqa: E402
from swift.infer import InferRequest, RequestConfig, TransformersEngine  # noqa: E402
from swift.model import load_model  # noqa: E402
from swift.template import get_template  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:tiny-chat")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--max_tokens", type=int, default=64)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1, help="untimed calls of the full workload, on both sides")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per side, taken in turns")
    a = p.parse_args()
    model, tokenizer, _ = load_model(a.model, torch_dtype=DTYPE, attn_impl="sdpa")
    model.eval()
    template = get_template("chatml", tokenizer)
    messages = [[{"role": "user", "content": f"Question {i}: what is {i}+{2 * i}?"}] for i in range(a.requests)]
    prompts = [template.encode_prompt(m) for m in messages]

    tokenizer.padding_side = "left"
    batch = tokenizer.pad({"input_ids": prompts}, return_tensors="pt")
    generate_kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=a.max_tokens,
                           min_new_tokens=a.max_tokens, num_return_sequences=a.n, use_cache=True,
                           pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)

    def baseline() -> int:
        with torch.inference_mode():
            out = model.generate(**batch, **generate_kwargs)  # min_new_tokens = max_new_tokens bans EOS
        return out.shape[0] * (out.shape[1] - batch["input_ids"].shape[1])

    engine_kwargs = dict(max_batch_size=a.requests * a.n)
    engine = TransformersEngine(model, tokenizer, template, **engine_kwargs)
    engine.eos_ids = set()  # EOS banned: every sample runs to max_tokens
    config = RequestConfig(max_tokens=a.max_tokens, temperature=1.0, top_k=0, top_p=1.0, n=a.n)

    def ours() -> int:
        return sum(r.completion_tokens for r in engine.infer([InferRequest(messages=m) for m in messages], config))

    torch.manual_seed(0)
    totals = {"batched model.generate (baseline)": [0, 0.0], "TransformersEngine": [0, 0.0]}
    for i in range(a.warmup + a.repeats):
        for name, run in zip(totals, (baseline, ours)):
            start = time.perf_counter()
            tokens = run()
            if i >= a.warmup:
                totals[name][0] += tokens
                totals[name][1] += time.perf_counter() - start
    rates = {name: tokens / seconds for name, (tokens, seconds) in totals.items()}
    base = next(iter(rates.values()))
    print(f"\nmodel {a.model}, {a.requests} requests x n={a.n}, {a.max_tokens} new tokens, "
          f"{a.warmup} warm-up + {a.repeats} timed calls per side")
    print("\n| engine | tokens/s | ratio |\n|---|---:|---:|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:.0f} | {rate / base:.2f} |")
    print_config({}, {"both": dict(model=a.model, torch_dtype=DTYPE, attn_impl="sdpa", template="chatml",
                                   requests=a.requests, n=a.n, max_tokens=a.max_tokens),
                      "baseline `model.generate`": {"padding_side": "left", "batch": tuple(batch["input_ids"].shape),
                                                    **generate_kwargs},
                      "swift `TransformersEngine`": {**engine_kwargs, "eos_ids": set(), "fast_decode": True,
                                                     **{k: getattr(config, k) for k in ("temperature", "top_k",
                                                                                        "top_p", "n", "max_tokens")}}},
                 [f"timing: {a.warmup} untimed warm-up call(s) of the full workload per side, then {a.repeats} "
                  "timed calls per side, the two sides in turns; tokens/s = generated tokens / time of the timed "
                  "calls.",
                  "the baseline uses generate's default dynamic KV cache (no static cache or torch.compile, which "
                  "Hugging Face suggests for GPUs)."])


if __name__ == "__main__":
    main()

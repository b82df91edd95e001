"""TransformersEngine vs a plain `model.generate` loop: generated tokens/s on the same requests.

    python benchmarks/infer_throughput.py [--requests 8] [--max_tokens 64] [--n 4] [--model builtin:tiny-chat]

The baseline calls `model.generate` once per request (num_return_sequences=n, sampling), the way a
simple script would; the engine receives all requests at once. Both sample at temperature 1 and
run to max_tokens (EOS ignored via a huge min length for the baseline and a stop-free config).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from swift.infer import InferRequest, RequestConfig, TransformersEngine  # noqa: E402
from swift.model import load_model  # noqa: E402
from swift.template import get_template  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:tiny-chat")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--max_tokens", type=int, default=64)
    p.add_argument("--n", type=int, default=4)
    a = p.parse_args()
    model, tokenizer, _ = load_model(a.model)
    model.eval()
    template = get_template("chatml", tokenizer)
    messages = [[{"role": "user", "content": f"Question {i}: what is {i}+{2 * i}?"}] for i in range(a.requests)]
    # the untrained tiny model would stop at random EOS tokens; ban EOS so both sides make max_tokens
    eos = tokenizer.eos_token_id
    engine = TransformersEngine(model, tokenizer, template, max_batch_size=a.requests * a.n)
    engine.eos_ids = set()

    torch.manual_seed(0)
    start = time.perf_counter()
    baseline_tokens = 0
    with torch.inference_mode():
        for m in messages:
            ids = torch.tensor([template.encode_prompt(m)])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                 max_new_tokens=a.max_tokens, min_new_tokens=a.max_tokens, num_return_sequences=a.n,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)
            baseline_tokens += (out.shape[1] - ids.shape[1]) * a.n
    baseline = baseline_tokens / (time.perf_counter() - start)

    config = RequestConfig(max_tokens=a.max_tokens, temperature=1.0, n=a.n, seed=0)
    engine.infer([InferRequest(messages=messages[0])], RequestConfig(max_tokens=4))  # warm-up
    start = time.perf_counter()
    responses = engine.infer([InferRequest(messages=m) for m in messages], config)
    ours = sum(r.completion_tokens for r in responses) / (time.perf_counter() - start)

    print(f"\nmodel {a.model}, {a.requests} requests x n={a.n}, {a.max_tokens} new tokens, "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'engine':<34} {'tokens/s':>9} {'ratio':>6}")
    print(f"{'model.generate loop (baseline)':<34} {baseline:>9.0f} {1.0:>6.2f}")
    print(f"{'TransformersEngine':<34} {ours:>9.0f} {ours / baseline:>6.2f}")


if __name__ == "__main__":
    main()

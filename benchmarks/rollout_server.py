"""`swift rollout` figures: weight-sync time per MB, generation through the server against a
colocated engine, and GRPO step time with and without --async_generate.

    python benchmarks/rollout_server.py [--sync_mb 160] [--steps 8]

1. Weight sync: a Qwen2-architecture model of about `--sync_mb` MB (fp32, random weights) is pushed
   to a server with 1 worker, in buckets of 16 / 64 / 256 MiB (gloo on CPU, NCCL on GPU), each sync
   checked by checksums. Baseline: the naive transport, `torch.save` of the state dict to /dev/shm
   and `load_state_dict` of it on the other side (timed in one process, so it is a lower bound).
2. Generation: 16 prompts x 4 samples x 64 tokens (built-in tiny model), colocated TransformersEngine
   against the same engine behind the server (1 and 2 data-parallel workers).
3. GRPO (8 prompts x 4 generations, 64 tokens, LoRA): s/step colocated, through the server, and
   through the server with --async_generate.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from swift.infer.protocol import RequestConfig  # noqa: E402
from swift.infer.transformers_engine import TransformersEngine  # noqa: E402
from swift.model import load_model  # noqa: E402
from swift.pipelines.rlhf import rlhf_main  # noqa: E402
from swift.rollout.client import RolloutClient, sync_state_dict  # noqa: E402
from swift.rollout.multi_turn import RolloutInferRequest  # noqa: E402
from swift.rollout.runner import rollout  # noqa: E402
from swift.template import get_template  # noqa: E402
from tests.deploy.serving import start, stop  # noqa: E402


def big_model_dir(target_mb: float) -> str:
    """A random Qwen2 model of about target_mb MB, saved with the built-in tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _, tokenizer, _ = load_model("builtin:tiny-chat")
    hidden = 512
    per_layer = 12 * hidden * hidden * 4 / 2 ** 20  # attention + MLP (intermediate 4h), fp32 MB
    layers = max(1, round((target_mb - 2 * 2048 * hidden * 4 / 2 ** 20) / per_layer))
    config = Qwen2Config(vocab_size=2048, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512,
                         tie_word_embeddings=False, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    path = tempfile.mkdtemp(prefix="swift-bench-sync-")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def bench_sync(sync_mb: float, repeats: int = 3) -> list[tuple]:
    path = big_model_dir(sync_mb)
    model, _, _ = load_model(path)
    mb = sum(t.numel() * t.element_size() for _, t in sync_state_dict(model)) / 2 ** 20
    rows = []
    # baseline: serialise to shared memory and load into a second copy
    target, _, _ = load_model(path)
    start_t = time.perf_counter()
    for _ in range(repeats):
        file = "/dev/shm/swift-bench-sync.pt" if os.path.isdir("/dev/shm") else os.path.join(tempfile.gettempdir(), "s.pt")
        torch.save(model.state_dict(), file)
        target.load_state_dict(torch.load(file))
        os.remove(file)
    rows.append(("torch.save + load_state_dict (/dev/shm)", mb, (time.perf_counter() - start_t) / repeats))
    base, proc = start("rollout", "--model", path, health="/health/")
    try:
        for bucket in (16, 64, 256):
            client = RolloutClient(port=int(base.rsplit(":", 1)[1]), timeout=600, bucket_mb=bucket)
            client.sync_weights(model)  # forms the group
            start_t = time.perf_counter()
            for _ in range(repeats):
                client.sync_weights(model)
            rows.append((f"swift rollout sync, {bucket} MiB buckets", mb, (time.perf_counter() - start_t) / repeats))
            client.close()
    finally:
        stop(proc)
    return rows


PROMPTS = [RolloutInferRequest(messages=[{"role": "user", "content": f"What is {i} + {3 * i + 7}?"}]) for i in range(16)]
CONFIG = RequestConfig(max_tokens=64, temperature=1.0)


def tokens_per_s(fn, repeats: int = 3) -> float:
    fn()  # warm up
    start_t, tokens = time.perf_counter(), 0
    for _ in range(repeats):
        tokens += sum(len(t.completion_ids) for t in fn())
    return tokens / (time.perf_counter() - start_t)


def bench_generation() -> list[tuple]:
    model, tokenizer, _ = load_model("builtin:tiny-chat")
    template = get_template("jinja", tokenizer)
    engine = TransformersEngine(model, tokenizer, template)
    rows = [("colocated TransformersEngine", tokens_per_s(
        lambda: rollout(engine, template, PROMPTS, CONFIG, 4, eos=tokenizer.eos_token_id)))]
    for dp in (1, 2):
        base, proc = start("rollout", "--model", "builtin:tiny-chat", "--data_parallel_size", str(dp),
                           health="/health/")
        try:
            client = RolloutClient(port=int(base.rsplit(":", 1)[1]))
            rows.append((f"swift rollout, {dp} worker(s)", tokens_per_s(lambda: client.rollout(PROMPTS, CONFIG, 4))))
        finally:
            stop(proc)
    return rows


def bench_grpo(steps: int) -> list[tuple]:
    def run(port: int | None, *extra: str) -> float:
        with tempfile.TemporaryDirectory() as out:
            argv = ["--rlhf_type", "grpo", "--model", "builtin:tiny-chat", "--dataset", f"builtin:arith-sft#{8 * steps}",
                    "--reward_funcs", "benchmarks.grpo_throughput:digit_reward", "--num_generations", "4",
                    "--per_device_train_batch_size", "32", "--max_completion_length", "64", "--temperature", "1.0",
                    "--max_steps", str(steps), "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
                    "--disable_tqdm", "true", "--output_dir", out, *extra]
            if port:
                argv += ["--vllm_server_port", str(port), "--rollout_mode", "server"]
            return rlhf_main(argv)["metrics"]["train_runtime"] / steps

    rows = [("colocated TransformersEngine", run(None))]
    base, proc = start("rollout", "--model", "builtin:tiny-chat", health="/health/")
    try:
        port = int(base.rsplit(":", 1)[1])
        rows.append(("swift rollout server", run(port)))
        rows.append(("swift rollout server + --async_generate", run(port, "--async_generate", "true")))
    finally:
        stop(proc)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sync_mb", type=float, default=160)
    p.add_argument("--steps", type=int, default=8)
    a = p.parse_args()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU x {os.cpu_count()}"
    sync, gen, grpo = bench_sync(a.sync_mb), bench_generation(), bench_grpo(a.steps)
    print(f"\n[{device}] weight sync ({'NCCL' if torch.cuda.is_available() else 'gloo'}), checksummed")
    print(f"{'transport':<42} {'MB':>7} {'s/sync':>8} {'ms/MB':>7} {'MB/s':>7} {'vs baseline':>12}")
    for name, mb, seconds in sync:
        print(f"{name:<42} {mb:>7.1f} {seconds:>8.3f} {1000 * seconds / mb:>7.2f} {mb / seconds:>7.0f} "
              f"{sync[0][2] / seconds:>11.2f}x")
    print("\ngeneration, 16 prompts x 4 samples x 64 tokens, built-in tiny model")
    print(f"{'engine':<42} {'tok/s':>8} {'vs colocated':>13}")
    for name, tps in gen:
        print(f"{name:<42} {tps:>8.0f} {tps / gen[0][1]:>12.2f}x")
    print(f"\nGRPO, 8 prompts x 4 generations, 64 tokens, LoRA, {a.steps} steps")
    print(f"{'mode':<42} {'s/step':>8} {'speed-up':>9}")
    for name, seconds in grpo:
        print(f"{name:<42} {seconds:>8.2f} {grpo[0][1] / seconds:>8.2f}x")
    print(json.dumps({"sync": sync, "generation": gen, "grpo": grpo}))


if __name__ == "__main__":
    main()

"""swift against TRL at a real model's shape: a randomly initialised model with Qwen2.5-0.5B's
configuration, timed for SFT (full and LoRA), DPO and GRPO steps, with each side's peak memory.

    python benchmarks/real_shape.py [--cases sft lora dpo grpo] [--steps 3] [--warmup 1] [--max_length 512]
    python benchmarks/real_shape.py --breakdown [--cases sft lora]  # where the memory and the time go

The tiny model's figures (the other scripts) measure framework overhead; here matrix products
dominate. The model is built locally (no download): Qwen2.5-0.5B's `config.json` values (24
layers, hidden 896, 14 heads / 2 KV heads, MLP 4864, 151,936-entry vocabulary with tied
embeddings, rope θ 1e6), weights drawn from its initialiser with a fixed seed, saved once with the
built-in tokenizer (its 2,048 ids are a subset of the vocabulary: the embedding and LM head keep the
real size, which is most of the LM-head cost). bf16 where the CPU has native bf16 (AMX or
AVX512-BF16) or on a GPU, fp32 otherwise. Each (case, side) runs in a fresh process, so its peak
RSS (`ru_maxrss`) is its own; both sides use the settings of the tiny-model scripts
(`sft_throughput`, `dpo_throughput`, `grpo_throughput`: gradient checkpointing off, the same
optimizer and schedule, sdpa attention), with this script's batch sizes and lengths, and time the
steps after `--warmup` with the same callback.

`--breakdown` looks inside the first timed step of each side instead (its rates are then not a
comparison: the profiler slows that step): the bytes of the weights, gradients and optimizer
states the step holds, the bytes autograd saved for the backward pass during its forward (unique
storages, parameters excluded: the activations), and the operators that took the most CPU time.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import dpo_throughput, grpo_throughput, sft_throughput  # noqa: E402
from benchmarks._common import CPU, environment, fmt, print_config  # noqa: E402

QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, vocab_size=151936, hidden_act="silu", use_sliding_window=False,
                  attention_dropout=0.0, initializer_range=0.02)
LORA = dict(lora_rank=8, lora_alpha=32, lora_dropout=0.05, target_modules=["all-linear"])
GRPO_PROMPTS, GRPO_GENERATIONS, GRPO_TOKENS = 2, 4, 128
UNITS = {"sft": "tokens/s", "lora": "tokens/s", "dpo": "steps/s", "grpo": "steps/s"}


def native_bf16() -> bool:
    if not CPU:
        return torch.cuda.is_bf16_supported()
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    return "amx_bf16" in flags or "avx512_bf16" in flags


def build(model_dir: str, dtype: str) -> int:
    """The Qwen2.5-0.5B-shaped model, saved with the built-in tokenizer; returns its parameter count."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from swift.model import load_model

    _, tokenizer, _ = load_model("builtin:tiny-chat")
    config = Qwen2Config(**QWEN25_05B, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, torch_dtype=dtype)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=getattr(torch, dtype))
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return sum(p.numel() for p in model.parameters())


def write_data(data_dir: str, rows: int) -> None:
    """Conversations whose answers run past any `--max_length` here, so every sequence of every
    step on both sides is exactly max_length tokens (peak memory then does not depend on which rows
    a side's sampler put together): short prompts from the alpaca demo, each answer the demo's
    answers strung together; pairs (DPO) the same with two different strings of answers."""
    with open(sft_throughput.DEFAULT_DATA) as f:
        alpaca = json.load(f)
    answers = [r["output"] for r in alpaca]

    def long_answer(start: int) -> str:
        return " ".join(answers[(start + k) % len(answers)] for k in range(12))

    sft, dpo = [], []
    for i in range(rows):
        messages = [{"role": "user", "content": alpaca[i % len(alpaca)]["instruction"]},
                    {"role": "assistant", "content": long_answer(i)}]
        sft.append({"messages": messages})
        dpo.append({"messages": messages, "rejected_response": long_answer(i + 500)})
    for name, data in (("sft.jsonl", sft), ("dpo.jsonl", dpo)):
        with open(os.path.join(data_dir, name), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in data)


def args_for(case: str, a, data_dir: str) -> SimpleNamespace:
    batch = {"sft": a.batch, "lora": a.batch, "dpo": a.dpo_batch, "grpo": None}[case]
    data = os.path.join(data_dir, "dpo.jsonl" if case == "dpo" else "sft.jsonl")
    return SimpleNamespace(steps=a.steps, warmup=a.warmup, batch=batch, max_length=a.max_length, data=data,
                           trl_packing="wrapped")


def _storages(tensors) -> dict[int, int]:
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t is not None}


def instrument(step: int, into: dict) -> None:
    """Make `Trainer.training_step` call number `step` (from 0) record what `--breakdown` prints:
    both sides' trainers run their forward and backward passes inside it."""
    from transformers import Trainer

    original, calls = Trainer.training_step, [0]

    def training_step(self, model, *args, **kwargs):
        calls[0] += 1
        if calls[0] - 1 != step:
            return original(self, model, *args, **kwargs)
        models = [m for m in (model, getattr(self, "ref_model", None)) if isinstance(m, torch.nn.Module)]
        params = {}
        for m in models:
            params.update(_storages(m.parameters()))
        saved = {}

        def pack(t):
            key = t.untyped_storage().data_ptr()
            if key not in params:
                saved[key] = t.untyped_storage().nbytes()
            return t

        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = original(self, model, *args, **kwargs)
        grads = _storages(p.grad for m in models for p in m.parameters())
        states = _storages(v for state in self.optimizer.state.values() for v in state.values()
                           if isinstance(v, torch.Tensor))
        gib = 2 ** 30
        into.update(weights_gib=sum(params.values()) / gib, grads_gib=sum(grads.values()) / gib,
                    optimizer_gib=sum(states.values()) / gib, saved_gib=sum(saved.values()) / gib,
                    top_ops=[(e.key, e.self_cpu_time_total / 1e6) for e in
                             sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:10]])
        return loss

    Trainer.training_step = training_step


def child(case: str, side: str, model_dir: str, dtype: str, a) -> dict:
    """One (case, side) in this process: its rate, what the trainer resolved, and peak RSS."""
    import benchmarks._common as common

    breakdown = {}
    if a.breakdown:
        instrument(a.warmup, breakdown)

    common.DTYPE = dtype
    for module in (sft_throughput, dpo_throughput, grpo_throughput):
        module.DTYPE = dtype
    sft_throughput.MODEL = dpo_throughput.MODEL = model_dir
    ns = args_for(case, a, model_dir)
    if case in ("sft", "lora"):
        shared, ours, theirs = sft_throughput.settings(ns, packing=False)
        shared["bf16"] = dtype == "bfloat16"
        if case == "lora":
            ours = {**ours, "tuner_type": "lora", **LORA}
        if side == "swift":
            rate, info = sft_throughput.run_swift(shared, ours, a.warmup)
        else:
            from peft import LoraConfig

            peft = LoraConfig(r=LORA["lora_rank"], lora_alpha=LORA["lora_alpha"], lora_dropout=LORA["lora_dropout"],
                              target_modules="all-linear", task_type="CAUSAL_LM") if case == "lora" else None
            rate, info = sft_throughput.run_trl(shared, theirs, ns.data, a.warmup, peft_config=peft)
        if case == "lora":
            theirs = {**theirs, "peft_config": f"LoraConfig(r={LORA['lora_rank']}, lora_alpha={LORA['lora_alpha']}, "
                                               f"lora_dropout={LORA['lora_dropout']}, target_modules='all-linear')"}
    elif case == "dpo":
        shared, ours, theirs = dpo_throughput.settings(ns)
        shared["bf16"] = dtype == "bfloat16"
        run = dpo_throughput.run_swift if side == "swift" else dpo_throughput.run_trl
        rate, info = run(shared, ours, a.warmup) if side == "swift" else run(shared, theirs, ns.data, a.warmup)
    else:
        grpo_throughput.PROMPTS, grpo_throughput.GENERATIONS = GRPO_PROMPTS, GRPO_GENERATIONS
        grpo_throughput.SAMPLING.update(num_generations=GRPO_GENERATIONS, max_completion_length=GRPO_TOKENS)
        shared, ours, theirs = grpo_throughput.settings(ns)
        shared["bf16"] = dtype == "bfloat16"
        if side == "swift":
            seconds, _, info = grpo_throughput.run_swift(model_dir, shared, ours, a.warmup, False)
        else:
            seconds, _, info = grpo_throughput.run_trl(model_dir, shared, theirs, a.warmup,
                                                       GRPO_PROMPTS * (a.warmup + a.steps))
        rate = 1 / seconds
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # host memory, GiB
    if not CPU:  # on a GPU the memory that matters is the device's
        peak = torch.cuda.max_memory_allocated() / 2 ** 30
    settings = {"both sides": shared, "swift": ours, "TRL": theirs}
    return {"rate": rate, "resolved": {k: str(v) for k, v in info.items()}, "peak_gib": peak, "breakdown": breakdown,
            "settings": {name: {k: str(v) for k, v in values.items()} for name, values in settings.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", choices=list(UNITS), default=list(UNITS))
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before them, on both sides")
    p.add_argument("--batch", type=int, default=2, help="SFT sequences per step")
    p.add_argument("--dpo_batch", type=int, default=1, help="DPO pairs per step")
    p.add_argument("--max_length", type=int, default=512)
    p.add_argument("--breakdown", action="store_true",
                   help="profile the first timed step of each side: memory by kind and the slowest operators")
    p.add_argument("--child", nargs=4, metavar=("CASE", "SIDE", "MODEL_DIR", "DTYPE"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        case, side, model_dir, dtype = a.child
        print("RESULT " + json.dumps(child(case, side, model_dir, dtype, a)), flush=True)
        return
    dtype = "bfloat16" if native_bf16() else "float32"
    results = {}
    with tempfile.TemporaryDirectory() as model_dir:
        params = build(model_dir, dtype)
        write_data(model_dir, 64)
        for case in a.cases:
            for side in ("TRL", "swift"):
                argv = [sys.executable, __file__, "--child", case, side, model_dir, dtype, "--steps", str(a.steps),
                        "--warmup", str(a.warmup), "--batch", str(a.batch), "--dpo_batch", str(a.dpo_batch),
                        "--max_length", str(a.max_length), *(["--breakdown"] if a.breakdown else [])]
                proc = subprocess.run(argv, capture_output=True, text=True)
                lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
                if proc.returncode or not lines:
                    raise SystemExit(f"{case}/{side} failed:\n{proc.stderr[-3000:]}")
                results[case, side] = json.loads(lines[-1][len("RESULT "):])
                print(f"{case} {side}: {results[case, side]['rate']:.4g} {UNITS[case]}, "
                      f"peak {results[case, side]['peak_gib']:.2f} GiB", flush=True)
    if a.breakdown:
        print_breakdown(a, results)
        return
    print(f"\nmodel: Qwen2.5-0.5B's configuration, random weights ({params / 1e6:.0f}M parameters), {dtype}; "
          f"{a.warmup} warm-up + {a.steps} timed steps; max_length {a.max_length}")
    memory = "peak RSS GiB" if CPU else "peak GPU GiB"
    print(f"\n| case | unit | TRL | swift | speed ratio | TRL {memory} | swift {memory} | memory ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    names = {"sft": "SFT full", "lora": "SFT LoRA", "dpo": "DPO full", "grpo": "GRPO full"}
    for case in a.cases:
        theirs, ours = results[case, "TRL"], results[case, "swift"]
        print(f"| {names[case]} | {UNITS[case]} | {theirs['rate']:.4g} | {ours['rate']:.4g} | "
              f"{ours['rate'] / theirs['rate']:.2f} | {theirs['peak_gib']:.2f} | {ours['peak_gib']:.2f} | "
              f"{ours['peak_gib'] / theirs['peak_gib']:.2f} |")
    print_config({}, {
        "SFT": f"batch {a.batch} sequences of exactly {a.max_length} tokens (alpaca demo prompts, answers longer "
               "than that, cut), no packing, loss on answers; settings as benchmarks/sft_throughput.py",
        "LoRA": f"{LORA} on both sides (TRL: peft `LoraConfig` with the same values, task CAUSAL_LM)",
        "DPO": f"batch {a.dpo_batch} pair(s) of sequences of exactly {a.max_length} tokens (cut keeping the end), "
               "sigmoid loss, β 0.1, a frozen copy as reference; settings as benchmarks/dpo_throughput.py",
        "GRPO": f"{GRPO_PROMPTS} prompts x {GRPO_GENERATIONS} generations, {GRPO_TOKENS} completion tokens, "
                "β 0.04; settings as benchmarks/grpo_throughput.py (swift: built-in engine; TRL: model.generate)"},
        ["each (case, side) ran in a fresh process; peak memory is that process's `ru_maxrss` on a CPU, "
         "`torch.cuda.max_memory_allocated` on a GPU",
         "the random model samples almost only ids past the built-in tokenizer's 2,048, which decode to nothing: "
         "GRPO completions run to the length limit on both sides and their rewards (the digit fraction) are 0; "
         "the timing is what is compared",
         f"machine: {environment()}",
         *(f"{case}, {name}: {fmt(values)}" for case in a.cases
           for name, values in results[case, "swift"]["settings"].items()),
         *(f"resolved {case}/{side}: {json.dumps(results[case, side]['resolved'])}" for case in a.cases
           for side in ("TRL", "swift"))])


def print_breakdown(a, results: dict) -> None:
    print(f"\nInside the first timed step ({a.warmup} warm-up), GiB; the profiler slowed it, so no rates."
          "\n\n| case | side | peak RSS | weights | gradients | optimizer states | saved for backward | rest |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (case, side), r in results.items():
        b = r["breakdown"]
        parts = [b[k] for k in ("weights_gib", "grads_gib", "optimizer_gib", "saved_gib")]
        print(f"| {case} | {side} | {r['peak_gib']:.2f} | " + " | ".join(f"{x:.2f}" for x in parts)
              + f" | {r['peak_gib'] - sum(parts):.2f} |")
    for (case, side), r in results.items():
        print(f"\n{case} {side}, operators by self CPU seconds in that step:")
        for name, seconds in r["breakdown"]["top_ops"]:
            print(f"  {seconds:8.2f}  {name}")


if __name__ == "__main__":
    main()

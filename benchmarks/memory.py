"""Peak memory (RSS) and step time of DPO and GRPO with a real vocabulary: swift against TRL.

    python benchmarks/memory.py [--length 2048] [--rows 8] [--steps 2] [--only dpo grpo]

The model is a randomly initialised Qwen2 with Qwen2.5-0.5B's vocabulary size (151,936 tokens,
tied embeddings) and a small body (hidden 64, 2 layers, 9.8M parameters), so that the output layer
and its logits dominate, as they do for real models at long lengths. fp32 on CPU, full-parameter
training, AdamW, gradient checkpointing off on both sides (`_common.trainer_settings`).

- DPO: `--rows` / 2 pairs whose chosen and rejected sequences are about `--length` tokens (half
  prompt, half answer), sigmoid loss, β 0.1, a frozen copy of the model as reference.
- GRPO: one prompt × `--rows` completions of exactly `--length` tokens (a random model never samples
  its end token), sampled at temperature 1.0 by each trainer's own generation path, β 0 (no
  reference model on either side), one update per rollout.

Each trainer runs `--steps` steps in a fresh process. Peak RSS is that process's maximum resident
set; "before" is its RSS just before training starts (model, data and libraries loaded), so
peak − before is what the steps themselves took. Step time is the median of the steps after the
first. Text is random words from the built-in tokenizer (its ids are all < 2,048, valid for the
larger vocabulary); both trainers get the same rows.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks._common import DTYPE, StepTimer, add_callback, print_config, resolved, trainer_settings  # noqa: E402

VOCAB = 151936  # Qwen2.5-0.5B
BODY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            tie_word_embeddings=True, max_position_embeddings=32768)


def rss_gb() -> float:
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 2 ** 20


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def build_model(path: str) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from swift.model import load_model

    torch.manual_seed(0)
    tokenizer = load_model("builtin:tiny-chat")[1]
    config = Qwen2Config(vocab_size=VOCAB, **BODY, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


def text_of(tokenizer, n: int, rng: random.Random) -> str:
    """About n tokens of random words."""
    words = [w for w in (tokenizer.decode([i]).strip() for i in range(300, 2000)) if w.isalpha() and len(w) > 2]
    text, tokens = "", 0
    while tokens < n:
        text += " " + " ".join(rng.choice(words) for _ in range(max(1, (n - tokens) // 2)))
        tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:n]
    return tokenizer.decode(ids).strip()


def dpo_rows(tokenizer, a) -> list[dict]:
    rng = random.Random(0)
    half = a.length // 2
    return [{"prompt": text_of(tokenizer, half, rng), "chosen": text_of(tokenizer, half, rng),
             "rejected": text_of(tokenizer, half, rng)} for _ in range(a.rows // 2 * (a.steps + 1))]


def settings(task: str, a) -> tuple[dict, dict, dict]:
    batch = a.rows // 2 if task == "dpo" else a.rows
    shared = trainer_settings(max_steps=a.steps, per_device_train_batch_size=batch, learning_rate=1e-5)
    if task == "dpo":
        swift = dict(rlhf_type="dpo", tuner_type="full", torch_dtype=DTYPE, attn_impl="sdpa", beta=0.1,
                     loss_type=["sigmoid"], max_length=a.length + 64, truncation_strategy="left")
        trl = dict(beta=0.1, loss_type=["sigmoid"], max_length=a.length + 64, padding_free=False,
                   precompute_ref_log_probs=False, use_liger_kernel=False, disable_dropout=True)
    else:
        sampling = dict(num_generations=a.rows, max_completion_length=a.length, temperature=1.0, top_p=1.0,
                        top_k=0, repetition_penalty=1.0, beta=0.0, num_iterations=1, loss_type="grpo",
                        scale_rewards="group", importance_sampling_level="token", log_completions=False,
                        use_vllm=False)
        swift = dict(rlhf_type="grpo", tuner_type="full", torch_dtype=DTYPE, attn_impl="sdpa",
                     **{**sampling, "loss_type": ["grpo"]}, reward_funcs=["text_length"],
                     external_plugins=[TEXT_LENGTH])
        trl = dict(sampling, use_liger_kernel=False, disable_dropout=True)
    return shared, swift, trl


TEXT_LENGTH = os.path.join(os.path.dirname(__file__), "..", "tests", "plugins", "text_length_reward.py")


def text_length(completions, **kwargs):
    """TRL's side of the reward swift gets from `tests/plugins/text_length_reward.py`."""
    return [float(len(c[-1]["content"] if isinstance(c, list) else c)) for c in completions]


def child(side: str, task: str, model_dir: str, a) -> dict:
    """One trainer, `a.steps` steps, in this (fresh) process."""
    from datasets import Dataset

    from swift.model import load_model

    shared, swift, trl = settings(task, a)
    tokenizer = load_model(model_dir)[1]
    prompt = [{"role": "user", "content": "Tell me a long story."}]
    timer = StepTimer(1)
    with tempfile.TemporaryDirectory() as out:
        if side == "swift":
            from swift.arguments.rlhf import RLHFArguments
            from swift.pipelines.rlhf import RLHFPipeline

            rows = os.path.join(out, "rows.jsonl")
            with open(rows, "w") as f:
                if task == "dpo":
                    for r in dpo_rows(tokenizer, a):
                        f.write(json.dumps({"messages": [{"role": "user", "content": r["prompt"]},
                                                         {"role": "assistant", "content": r["chosen"]}],
                                            "rejected_response": r["rejected"]}) + "\n")
                else:
                    for _ in range(a.steps):
                        f.write(json.dumps({"messages": prompt}) + "\n")
            pipeline = RLHFPipeline(RLHFArguments(**shared, **swift, model=model_dir, dataset=[rows],
                                                  output_dir=os.path.join(out, "run")))
            add_callback(pipeline, timer)
            trainer = pipeline.build_trainer()
            before = rss_gb()
            trainer.train()
            if hasattr(trainer, "close"):
                trainer.close()
        else:
            from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer

            model = load_model(model_dir, torch_dtype=DTYPE, attn_impl="sdpa")[0]
            if task == "dpo":
                data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}],
                                           "chosen": [{"role": "assistant", "content": r["chosen"]}],
                                           "rejected": [{"role": "assistant", "content": r["rejected"]}]}
                                          for r in dpo_rows(tokenizer, a)])
                trainer = DPOTrainer(model=model, ref_model=copy.deepcopy(model), train_dataset=data,
                                     args=DPOConfig(**shared, **trl, output_dir=out), processing_class=tokenizer,
                                     callbacks=[timer])
            else:
                data = Dataset.from_list([{"prompt": prompt} for _ in range(a.steps)])
                trainer = GRPOTrainer(model=model, reward_funcs=text_length, train_dataset=data,
                                      args=GRPOConfig(**shared, **trl, output_dir=out), processing_class=tokenizer,
                                      callbacks=[timer])
            before = rss_gb()
            trainer.train()
        steps = [b - a_ for a_, b in zip(timer.marks[1:], timer.marks[2:])]
        import torch

        gpu = torch.cuda.max_memory_allocated() / 2 ** 30 if torch.cuda.is_available() else None
        return {"peak_gb": peak_gb(), "before_gb": before, "step_s": statistics.median(steps) if steps else None,
                "peak_gpu_gb": gpu,
                "resolved": {k: str(v) for k, v in resolved(trainer).items()}}


def measure(side: str, task: str, model_dir: str, a) -> dict:
    argv = [sys.executable, __file__, "--child", side, task, model_dir, "--length", str(a.length), "--rows",
            str(a.rows), "--steps", str(a.steps)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["killed"])[-1], "code": proc.returncode}
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=2048, help="tokens per sequence (DPO) or completion (GRPO)")
    p.add_argument("--rows", type=int, default=8, help="sequences per step: DPO rows/2 pairs, GRPO completions")
    p.add_argument("--steps", type=int, default=2, help="steps per run; time is the median after the first")
    p.add_argument("--only", nargs="+", default=["dpo", "grpo"], choices=["dpo", "grpo"])
    p.add_argument("--child", nargs=3, metavar=("SIDE", "TASK", "MODEL_DIR"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(*a.child, a)))
        return
    with tempfile.TemporaryDirectory() as model_dir:
        build_model(model_dir)
        results = {(task, side): measure(side, task, model_dir, a) for task in a.only for side in ("trl", "swift")}
    print(f"\nQwen2 with a {VOCAB:,}-token vocabulary, body {BODY}, {a.rows} sequences × {a.length} tokens per "
          f"step, {a.steps} steps per run\n")
    print("| step | trainer | peak RSS GB | before training GB | peak − before GB | peak GPU GB | s/step | peak ratio "
          "| speed ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for task in a.only:
        trl, ours = results[(task, "trl")], results[(task, "swift")]
        for name, r in (("TRL", trl), ("swift", ours)):
            if "error" in r:
                print(f"| {task} | {name} | failed: {r['error'][:80]} (exit {r['code']}) | | | | | | |")
                continue
            gpu = r.get("peak_gpu_gb") is not None
            key = "peak_gpu_gb" if gpu else "peak_gb"  # on a GPU the ratio is of GPU memory
            ratio = r[key] / trl[key] if "error" not in trl else float("nan")
            speed = trl["step_s"] / r["step_s"] if "error" not in trl and r["step_s"] and trl["step_s"] else float("nan")
            print(f"| {task} | {name} | {r['peak_gb']:.2f} | {r['before_gb']:.2f} | {r['peak_gb'] - r['before_gb']:.2f}"
                  f" | {f'{r[key]:.2f}' if gpu else '–'} | {r['step_s'] or float('nan'):.2f} | {ratio:.2f}"
                  f" | {speed:.2f} |")
    for task in a.only:
        shared, swift, trl = settings(task, a)
        print_config(shared, {f"swift ({task})": swift, f"TRL ({task})": trl},
                     ["peak RSS: ru_maxrss of a fresh process per trainer; before training: VmRSS after the "
                      "model, reference and data are loaded; peak GPU: torch.cuda.max_memory_allocated (on a GPU "
                      "the peak ratio is of it).",
                      "GRPO: β 0 on both sides (no reference model); completions run to the length limit.",
                      "swift computes log-probs from hidden states in chunks of positions "
                      "(`swift.rlhf.logps.head_logps`); TRL materialises the logits."],
                     {side: results[(task, side)].get("resolved", {}) for side in ("swift", "trl")})


if __name__ == "__main__":
    main()

"""Seconds per PPO step of `swift rlhf --rlhf_type ppo` against a bare PyTorch PPO loop over the
same batches.

    python benchmarks/ppo_throughput.py [--steps 8] [--warmup 2] [--repeats 3]

ms-swift's `--rlhf_type ppo` runs TRL's PPOTrainer, which TRL 1.16 (the version here) no longer has,
so the baseline is a plain loop written for this benchmark: `model.generate` (KV cache, sampling at
temperature 1, no top-k/top-p), then the policy's, the reference's and the critic's forwards, GAE
and whitening, and one AdamW step on the policy and value losses: the work a PPO step must do, with
nothing else. Both sides: the built-in tiny model saved as a directory, full-parameter training of
the policy and of a critic that is a copy of it with a one-label value head, 8 prompts (one
completion each) × 64 completion tokens, fp32, no gradient checkpointing, a frozen reference (β 0.05,
k1 KL in the reward), one optimizer step per rollout (`--num_ppo_epochs 1 --num_mini_batches 1`),
the same reward function. Time runs from the end of the last warm-up step to the end of the last
step; the two take turns `--repeats` times and the medians are reported. A third row times swift with
`--critic_backbone shared` (a value head on the policy: no second model), against the same baseline.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks._common import DTYPE, StepTimer, add_callback, print_config, take_turns, trainer_settings  # noqa: E402
from swift.arguments.rlhf import RLHFArguments  # noqa: E402
from swift.dataset.loader import load_rows  # noqa: E402
from swift.pipelines.rlhf import RLHFPipeline  # noqa: E402

PROMPTS, TOKENS, LR, BETA = 8, 64, 1e-5, 0.05
PPO = dict(gamma=1.0, lam=0.95, epsilon=0.2, cliprange_value=0.2, vf_coef=0.1)


def digit_reward(completions, **kwargs):
    """The same cheap reward on both sides: the fraction of digits in the completion."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def run_swift(model_dir: str, a, critic_backbone: str = "separate") -> float:
    timer = StepTimer(a.warmup)
    shared = trainer_settings(max_steps=a.warmup + a.steps, per_device_train_batch_size=PROMPTS, learning_rate=LR)
    with tempfile.TemporaryDirectory() as out:
        args = RLHFArguments(**shared, rlhf_type="ppo", tuner_type="full", torch_dtype=DTYPE, attn_impl="sdpa",
                             model=model_dir, output_dir=out,
                             dataset=[f"builtin:arith-sft#{PROMPTS * (a.warmup + a.steps)}"],
                             dataset_shuffle=False, reward_funcs=["benchmarks.ppo_throughput:digit_reward"],
                             max_completion_length=TOKENS, temperature=1.0, top_p=1.0, top_k=0, beta=BETA,
                             num_ppo_epochs=1, num_mini_batches=1, log_completions=False,
                             critic_backbone=critic_backbone, **PPO)
        pipeline = RLHFPipeline(args)
        add_callback(pipeline, timer)
        pipeline.run()
    return timer.seconds / timer.steps


def _logps_and_values(model, ids, mask, start, values=False):
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
    if values:
        return out[:, start - 1:-1, 0].float()
    logits = out[:, start - 1:-1].float()
    return logits.log_softmax(-1).gather(-1, ids[:, start:, None]).squeeze(-1)


def run_plain(model_dir: str, a) -> float:
    """One PPO step per rollout in plain PyTorch (see the module docstring)."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

    torch.manual_seed(42)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    critic = AutoModelForTokenClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32,
                                                             attn_implementation="sdpa")
    critic.config.pad_token_id = tokenizer.pad_token_id
    reference.requires_grad_(False)
    optimizer = torch.optim.AdamW([*policy.parameters(), *critic.parameters()], lr=LR, weight_decay=0.0, fused=True)
    rows = load_rows([f"builtin:arith-sft#{PROMPTS * (a.warmup + a.steps)}"], shuffle=False).rows
    marks = []
    for step in range(a.warmup + a.steps):
        prompts = [tokenizer.apply_chat_template(r["messages"][:-1], tokenize=False, add_generation_prompt=True)
                   for r in rows[step * PROMPTS:(step + 1) * PROMPTS]]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        start = enc["input_ids"].size(1)
        policy.eval()
        with torch.no_grad():
            ids = policy.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=TOKENS,
                                  pad_token_id=tokenizer.pad_token_id)
        policy.train()
        completion = ids[:, start:]
        done = (completion == tokenizer.eos_token_id).int().cumsum(-1)
        cmask = ((done == 0) | ((done == 1) & (completion == tokenizer.eos_token_id))).float()
        mask = torch.cat([enc["attention_mask"], cmask.long()], dim=1)
        texts = tokenizer.batch_decode(completion * cmask.long(), skip_special_tokens=True)
        scores = torch.tensor(digit_reward(texts))
        with torch.no_grad():
            old = _logps_and_values(policy, ids, mask, start)
            ref = _logps_and_values(reference, ids, mask, start)
            values = _logps_and_values(critic, ids, mask, start, values=True) * cmask
        rewards = -BETA * (old - ref) * cmask
        last = cmask.sum(-1).long() - 1
        rewards[torch.arange(PROMPTS), last] += scores
        advantages, running = torch.zeros_like(rewards), torch.zeros(PROMPTS)
        for t in reversed(range(rewards.size(1))):
            following = values[:, t + 1] if t + 1 < rewards.size(1) else torch.zeros(PROMPTS)
            running = rewards[:, t] + PPO["gamma"] * following - values[:, t] + PPO["gamma"] * PPO["lam"] * running
            advantages[:, t] = running
        returns = advantages + values
        picked = advantages[cmask.bool()]
        advantages = (advantages - picked.mean()) / (picked.var() + 1e-8).sqrt() * cmask
        logps = _logps_and_values(policy, ids, mask, start)
        ratio = (logps - old).exp()
        eps = PPO["epsilon"]
        pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - eps, 1 + eps))
        new_values = _logps_and_values(critic, ids, mask, start, values=True)
        clipped = values + (new_values - values).clamp(-PPO["cliprange_value"], PPO["cliprange_value"])
        vf = 0.5 * torch.max((new_values - returns) ** 2, (clipped - returns) ** 2)
        tokens = cmask.sum()
        loss = (pg * cmask).sum() / tokens + PPO["vf_coef"] * (vf * cmask).sum() / tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
    return (marks[-1] - marks[a.warmup - 1]) / a.steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them, on both sides")
    p.add_argument("--repeats", type=int, default=3, help="runs per side, taken in turns; medians reported")
    a = p.parse_args()
    runs = take_turns({"bare PyTorch PPO loop": lambda d: run_plain(d, a),
                       "swift rlhf --rlhf_type ppo": lambda d: run_swift(d, a),
                       "swift, --critic_backbone shared": lambda d: run_swift(d, a, "shared")}, a.repeats)
    base = statistics.median(runs["bare PyTorch PPO loop"])
    print(f"\nmodel builtin:tiny-chat (saved as a local directory), {PROMPTS} prompts x 1 completion, {TOKENS} "
          f"tokens, {a.warmup} warm-up + {a.steps} timed steps, median of {a.repeats} runs each")
    print("\n| trainer | s/step | speed-up | runs (s/step) |\n|---|---:|---:|---|")
    for name, seconds in runs.items():
        median = statistics.median(seconds)
        print(f"| {name} | {median:.2f} | {base / median:.2f} | {', '.join(f'{s:.2f}' for s in seconds)} |")
    print_config(trainer_settings(max_steps=f"{a.warmup}+{a.steps}", per_device_train_batch_size=PROMPTS,
                                  learning_rate=LR),
                 {"both sides": {**PPO, "beta": BETA, "kl_estimator": "k1", "num_ppo_epochs": 1, "num_mini_batches": 1,
                                 "max_completion_length": TOKENS, "temperature": 1.0}},
                 ["the baseline: one AdamW (fused) over policy and critic, gradients clipped at 1.0 per model, "
                  "token-mean losses over the rollout's completion tokens (what swift's default dapo aggregation "
                  "is with one micro-batch)."], {})


if __name__ == "__main__":
    main()

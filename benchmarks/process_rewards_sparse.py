"""GRPO with a sparse outcome reward alone against outcome + dense process rewards (`--prm_model`),
on a six-step task whose steps the built-in tiny model can learn to check (docs/grpo.md quotes the
table; `process_rewards.py` is the same comparison on running sums, where it cannot).

    python benchmarks/process_rewards_sparse.py --quickstart output/quickstart [--seeds 42 7 1] [--out DIR]

The task: a four-digit prompt ("0427") answered by six digits, one per line, each of which must be
even. The outcome reward (`even_digits`, benchmarks/even_digits_reward.py) is 1 only when all six
are, so it is sparse; a step's check is local, so a PRM can learn it. All 10,000 prompts, 500 held
out by a fixed shuffle.
1. policy: `swift sft` (full) from the quickstart's sft model, 300 steps at 1e-3 (cosine), batch 64,
   on answers of six uniformly random digits: it answers in the format, each digit even about half
   the time: all six in about 1 answer in 64 (0.002 to 0.022 of held-out answers at GRPO's step 0).
2. PRM data: the policy samples one answer (temperature 1.0) for each of 8,000 training prompts and
   the 500 held-out ones; a step is labelled right when it is one even digit. The PRM checks digits,
   not their number: an all-even answer of five or seven lines has every step right but an outcome
   reward of 0.
3. PRM: `swift rlhf --rlhf_type prm` (full) from the policy, 200 steps of 32 at 2e-3; its held-out
   step accuracy is printed beside the majority-label rate.
4. GRPO (LoRA, 60 steps of 16 prompts x 8 answers at 1e-3, temperature 1.0, no KL) with the outcome
   reward, with and without `--prm_model`; the held-out outcome reward (one sampled answer per
   held-out prompt) every 5 steps, and the first step at which each arm reaches the target (the
   outcome arm's final accuracy less 0.05, per seed).

About 10 minutes with the defaults on 2 cores (measured 2026-11-26); not run by CI.
"""
from __future__ import annotations

import argparse
import json
import os
import random

from even_digits_reward import STEPS, even_steps
from prm_learnability import majority_rate
from process_rewards import COMMON, ROOT, grpo, label_samples, report, swift, train_prm, write_split

PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "even_digits_reward.py")


def write_task(out: str) -> tuple[str, str]:
    rng = random.Random(0)
    rows = [{"messages": [{"role": "user", "content": f"{n:04d}"},
                          {"role": "assistant", "content": "\n".join(str(rng.randrange(10)) for _ in range(STEPS))}]}
            for n in range(10000)]
    return write_split(rows, out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quickstart", default=os.path.join(ROOT, "output", "quickstart"))
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 7, 1])
    p.add_argument("--out", default=os.path.join(ROOT, "output", "process_rewards_sparse"))
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    train, held = write_task(a.out)
    policy = os.path.join(a.out, "policy")
    swift("sft", "--model", os.path.join(a.quickstart, "sft"), "--tuner_type", "full", "--dataset", train,
          "--per_device_train_batch_size", "64", "--learning_rate", "1e-3", "--adam_beta2", "0.98", "--max_steps",
          "300", "--warmup_ratio", "0.05", *COMMON, "--output_dir", policy, log=policy + ".log")
    prm_train, prm_held = (os.path.join(a.out, f"prm_{s}.jsonl") for s in ("train", "eval"))

    def label(prompt: str, steps: list[str]) -> list[bool]:
        return even_steps(steps)

    label_samples(policy, train, prm_train, 1.0, 8000, label, max_new_tokens=16)
    label_samples(policy, held, prm_held, 1.0, 500, label, max_new_tokens=16)
    prm = os.path.join(a.out, "prm")
    accuracy = train_prm(policy, prm_train, prm_held, prm, lr="2e-3", steps=200)
    with open(prm_held) as f:
        samples = [json.loads(line) for line in f]
    print(f"policy at temperature 1.0: {sum(map(len, (s['labels'] for s in samples))) / len(samples):.2f} steps per "
          f"answer, {sum(all(s['labels']) and len(s['labels']) == STEPS for s in samples) / len(samples):.3f} of "
          "the held-out answers right")
    print(f"PRM held-out step accuracy {accuracy:.3f}, majority-label rate {majority_rate(prm_held):.3f}")
    print("| seed | reward | held-out accuracy at steps 0, 5, ..., 60 | first step at the target | sampled length "
          "(tokens), steps 0 → 60 |\n|---|---|---|---|---|")
    reward = ("--external_plugins", PLUGIN, "--reward_funcs", "even_digits")
    for seed in a.seeds:
        runs = {"outcome": [], "outcome + process": ["--prm_model", prm]}
        report(seed, {name: grpo(policy, train, held, os.path.join(a.out, f"grpo_{seed}_{name.split()[-1]}"), 1.0,
                                 seed, *extra, reward=reward, metric="even_digits", eval_steps=5, max_length=16)
                      for name, extra in runs.items()})


if __name__ == "__main__":
    main()

"""Rare-output estimation and attack cost on the built-in tiny model (CPU).

1. Estimation error against samples: for the 4 rarest-but-present argmax events of the built-in
   model over 3 hex tokens (the ordinary tokens greedy decoding gives for 1 or 2 of the 31^3 inputs,
   p < 1e-4; exact by enumeration), brute force, ITGIS (T 0.03) and MHIS (T 0.1, 64 chains, burn-in
   16 steps: the model evaluations column counts them) at 2^8..2^14 samples and 4 seeds each: the share of runs
   within a factor of 3 of the exact value, the share that saw nothing (estimate 0), and the mean
   |log10(estimate / exact)| with a miss counted as 3 (a factor of 1000), as in the LPE paper's
   comparison (arXiv 2410.13211). A table and rare_event.png.
2. Attack wall time per target, GCG (nanoGCG 0.3.0, 20 steps, search width 64, top-k 32, an
   8-token suffix) against BEAST (k1 = k2 = 6, 8 tokens), on the toy safety goals with the built-in
   model; one warm-up target each first.

python benchmarks/rare_event.py [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time

import torch

from swift.model import load_model
from swift.safety.estimate import EstimateArguments, build_distribution, estimate, greedy_counts
from swift.safety.model import special_ids

BUDGETS = [2 ** 8, 2 ** 10, 2 ** 12, 2 ** 14]
SEEDS = range(4)
METHODS = {"bruteforce": {}, "itgis": {"temperature": 0.03},
           "mhis": {"temperature": 0.1, "batch_size": 64, "mhis_burn_in": 16}}


def rare_targets(model, tokenizer, count=4):
    """As tests/safety/test_estimate.py: the first ordinary tokens, by id, that greedy decoding gives
    for 1 or 2 of the 31^3 hex inputs."""
    dist = build_distribution(EstimateArguments(target_word="x", sequence_length=3), tokenizer, 2048, "cpu")
    counts = greedy_counts(model, dist)
    special = special_ids(tokenizer)
    return [t for t in range(len(counts)) if 1 <= counts[t] <= 2 and t not in special
            and len(tokenizer.encode(tokenizer.decode([t]), add_special_tokens=False)) == 1][:count]


def estimation(model, tokenizer):
    rows = []
    targets = rare_targets(model, tokenizer)
    exact = {t: estimate(model, tokenizer, EstimateArguments(target_word=tokenizer.decode([t]), method="exact",
                                                             use_argmax=True, sequence_length=3,
                                                             batch_size=8192))["estimate"] for t in targets}
    for method, extra in METHODS.items():
        for n in BUDGETS:
            errors, within, missed, seconds, used = [], 0, 0, 0.0, 0
            for t in targets:
                for seed in SEEDS:
                    r = estimate(model, tokenizer, EstimateArguments(
                        target_word=tokenizer.decode([t]), method=method, use_argmax=True, sequence_length=3,
                        n_samples=n, seed=seed, **extra))
                    p, seconds, used = r["estimate"], seconds + r["seconds"], used + r["samples"]
                    errors.append(3.0 if p == 0 else min(3.0, abs(math.log10(p / exact[t]))))
                    within += exact[t] / 3 <= p <= exact[t] * 3
                    missed += p == 0
            runs = len(targets) * len(SEEDS)
            rows.append({"method": method, "samples": n, "within_3x": within / runs, "saw_nothing": missed / runs,
                         "mean_abs_log10_error": sum(errors) / runs, "seconds_per_run": seconds / runs,
                         "model_evaluations": used // runs})
            print(json.dumps(rows[-1]), flush=True)
    return exact, rows


def attack_times(model, tokenizer):
    from swift.dataset.toy_safety import toy_safety_behaviors
    from swift.safety.attack import AttackArguments, Prompter, attack_one
    from swift.template import get_template

    template = get_template("chatml", tokenizer)
    prompter = Prompter(model, tokenizer, template)
    goals = toy_safety_behaviors("train")
    configs = {"gcg": dict(attack="gcg", gcg_num_steps=20, gcg_search_width=64, gcg_topk=32,
                           gcg_optim_str_init="x x x x x x x x"),
               "beast": dict(attack="beast", beast_k1=6, beast_k2=6, beast_length=8)}
    out = {}
    for name, config in configs.items():
        a = AttackArguments(model="builtin:tiny-chat", dataset="builtin:toy-safety-behaviors", **config)
        attack_one(a, prompter, goals[0])  # warm-up
        started = time.perf_counter()
        for row in goals[1:5]:
            attack_one(a, prompter, row)
        out[name] = {"seconds_per_target": (time.perf_counter() - started) / 4, "config": config}
        print(json.dumps({name: out[name]}), flush=True)
    return out


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for method in METHODS:
        mine = [r for r in rows if r["method"] == method]
        ax.plot([r["samples"] for r in mine], [r["mean_abs_log10_error"] for r in mine], marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("samples")
    ax.set_ylabel("mean |log10(estimate / exact)| (miss = 3)")
    ax.set_title("argmax events p < 1e-4, built-in model, hex^3")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model, tokenizer, _ = load_model("builtin:tiny-chat")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    print(json.dumps({"machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                      "torch": torch.__version__, "threads": torch.get_num_threads(), "methods": METHODS,
                      "budgets": BUDGETS, "seeds": list(SEEDS)}))
    exact, rows = estimation(model, tokenizer)
    attacks = attack_times(model, tokenizer)
    print("| method | samples | model evaluations | within 3× | saw nothing | mean abs log10 error | s per run |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['samples']} | {r['model_evaluations']} | {r['within_3x']:.2f} | "
              f"{r['saw_nothing']:.2f} | {r['mean_abs_log10_error']:.2f} | {r['seconds_per_run']:.2f} |")
    ratio = attacks["gcg"]["seconds_per_target"] / attacks["beast"]["seconds_per_target"]
    print(f"attack seconds per target: GCG {attacks['gcg']['seconds_per_target']:.2f}, BEAST "
          f"{attacks['beast']['seconds_per_target']:.2f} (GCG/BEAST {ratio:.1f}x)")
    plot(rows, os.path.join(args.out, "rare_event.png"))
    with open(os.path.join(args.out, "rare_event.json"), "w") as f:
        json.dump({"exact": exact, "estimation": rows, "attacks": attacks}, f, indent=2)


if __name__ == "__main__":
    main()

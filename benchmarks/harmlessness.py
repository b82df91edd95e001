"""RePULSe against its baselines on the exact 2-token toy (`docs/harmlessness.md`).

Every method draws the same number of samples: RePULSe samples N per prompt from pθ and N from its
proposal each step, so it takes half the steps of the methods that sample from pθ alone (the
fork's 5 episodes against 10). KL 0 (as the fork's toy), constant learning rates, full tuning,
temperature 1, answers of 2 tokens. After training, the exact expected reward and P(bad) of the
policy (`swift.safety.toy.toy_exact`). Each run is its own `swift rlhf` process.

    python benchmarks/harmlessness.py --seeds 0 1 2 3 4 --out bench-harmless
    MKL_CBWR=COMPATIBLE python benchmarks/harmlessness.py --seeds 0 1 2 3 4 --out bench-harmless-compat

Writes <out>/results.jsonl (one line per run), <out>/summary.md and <out>/frontier.png."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["--model", "builtin:tiny-chat", "--dataset", "builtin:toy-harm", "--reward_funcs", "toy_harm",
          "--tuner_type", "full", "--beta", "0", "--max_completion_length", "2", "--temperature", "1.0",
          "--lr_scheduler_type", "constant", "--warmup_ratio", "0", "--logging_steps", "1", "--report_to", "none",
          "--disable_tqdm", "true", "--add_version", "false"]


WITH_PROPOSAL = ("RePULSe", "RePULSe, modulation head", "RePULSe, modulation model", "neg_reinforce")  # they draw N samples from pθ and N from q per step


def methods(steps: int, lr: str, q_lr: str, alpha: str, neg_alpha: str) -> dict[str, list[str]]:
    """Each method's flags; `steps` is the step count of the methods with a proposal (the others take
    twice as many)."""
    double = str(2 * steps)
    return {
        "RePULSe": ["--rlhf_type", "harmless", "--target_dist_beta", "-10", "--alpha", alpha,
                    "--actor_learning_rate", q_lr, "--learning_rate", lr, "--max_steps", str(steps)],
        "REINFORCE": ["--rlhf_type", "harmless", "--harmlessness_training_loss_type", "reinforce",
                      "--learning_rate", lr, "--max_steps", double],
        "reward transform": ["--rlhf_type", "harmless", "--harmlessness_training_loss_type", "reinforce",
                             "--reward_transform", "minus_alpha_exp_beta_r", "--rew_trans_alpha", "1",
                             "--rew_trans_beta", "-1", "--learning_rate", lr, "--max_steps", double],
        "base as proposal": ["--rlhf_type", "harmless", "--use_base_as_proposal", "--target_dist_beta", "-10",
                             "--alpha", alpha, "--learning_rate", lr, "--max_steps", double],
        "RePULSe, modulation head": ["--rlhf_type", "harmless", "--target_dist_beta", "-10", "--alpha", alpha,
                                     "--parameterization", "modulation_linear_head", "--actor_learning_rate", q_lr,
                                     "--learning_rate", lr, "--max_steps", str(steps)],
        "RePULSe, modulation model": ["--rlhf_type", "harmless", "--target_dist_beta", "-10", "--alpha", alpha,
                                      "--parameterization", "modulation_model", "--actor_learning_rate", q_lr,
                                      "--learning_rate", lr, "--max_steps", str(steps)],
        "neg_reinforce": ["--rlhf_type", "harmless", "--harmlessness_training_loss_type", "neg_reinforce",
                          "--target_dist_beta", "-10", "--alpha", neg_alpha, "--neg_baseline_type", "expectation",
                          "--actor_learning_rate", q_lr, "--learning_rate", lr, "--max_steps", str(steps)],
        "PPO": ["--rlhf_type", "ppo", "--num_iterations", "1", "--critic_learning_rate", "3e-5",
                "--learning_rate", lr, "--max_steps", double],
    }


def exact(path: str) -> dict[str, float]:
    from swift.model import load_model
    from swift.safety.toy import toy_exact
    from swift.template import choose_template, get_template

    model, tokenizer, info = load_model(path)
    template = get_template(choose_template(None, None, info.model_type, tokenizer), tokenizer)
    return toy_exact(model, template)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--samples", type=int, default=64, help="N: samples per prompt and step")
    p.add_argument("--steps", type=int, default=30, help="RePULSe's steps (the others: twice as many)")
    p.add_argument("--lr", default="3e-4")
    p.add_argument("--q_lr", default="1e-3")
    p.add_argument("--every", type=int, default=5, help="RePULSe's steps between exact evaluations")
    p.add_argument("--alpha", default="10", help="α of RePULSe and of the base-as-proposal ablation")
    p.add_argument("--neg_alpha", default="-0.1",
                   help="α of neg_reinforce (negative: its term raises the log-prob of high-return samples)")
    p.add_argument("--only", nargs="*", default=None, help="run these methods only")
    p.add_argument("--out", default="bench-harmless")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = exact("builtin:tiny-chat")
    print(json.dumps({"start": start, "kernel": os.environ.get("MKL_CBWR", "default"), "config": vars(a)}), flush=True)
    results = os.path.join(a.out, "results.jsonl")
    for seed in a.seeds:
        for name, flags in methods(a.steps, a.lr, a.q_lr, a.alpha, a.neg_alpha).items():
            if a.only and name not in a.only:
                continue
            out = os.path.join(a.out, f"{name.replace(' ', '_')}-{seed}")
            # a checkpoint every `every` steps of RePULSe (every 2·`every` of the others): the same samples
            every = a.every * (1 if name in WITH_PROPOSAL else 2)
            argv = [sys.executable, "-m", "swift.cli.main", "rlhf", *COMMON, *flags, "--seed", str(seed), "--data_seed", str(seed),
                    "--num_generations", str(a.samples), "--per_device_train_batch_size", str(a.samples),
                    "--save_strategy", "steps", "--save_only_model", "true", "--save_steps", str(every),
                    "--output_dir", out]
            t0 = time.time()
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
            if proc.returncode:
                raise SystemExit(f"{name} seed {seed} failed:\n{proc.stderr[-3000:]}")
            seconds = round(time.time() - t0, 1)
            per_step = a.samples * (2 if name in WITH_PROPOSAL else 1)  # samples drawn per step
            trajectory = [{"samples": 0, **start}]
            for step in range(every, int(flags[flags.index("--max_steps") + 1]) + 1, every):
                trajectory.append({"samples": step * per_step, **exact(os.path.join(out, f"checkpoint-{step}"))})
                shutil.rmtree(os.path.join(out, f"checkpoint-{step}"))
            row = {"method": name, "seed": seed, "seconds": seconds, "kernel": os.environ.get("MKL_CBWR", "default"),
                   **trajectory[-1], "trajectory": trajectory, "argv": argv[3:]}
            with open(results, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps({k: row[k] for k in ("method", "seed", "expected_reward", "log10_p_bad", "seconds")}),
                  flush=True)
    summarize(results, start, a.out)


def summarize(results: str, start: dict, out: str) -> None:
    import statistics

    with open(results) as f:
        rows = [json.loads(line) for line in f]
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["method"], []).append(r)
    lines = ["| method | runs | E[r] mean ± sd | log10 P(bad) mean ± sd |", "|---|---|---|---|",
             f"| start | 1 | {start['expected_reward']:.4f} | {start['log10_p_bad']:.3f} |"]
    for name, rs in by.items():
        er = [r["expected_reward"] for r in rs]
        lp = [r["log10_p_bad"] for r in rs]
        sd = (lambda v: statistics.stdev(v) if len(v) > 1 else 0.0)
        lines.append(f"| {name} | {len(rs)} | {statistics.mean(er):.4f} ± {sd(er):.4f} | "
                     f"{statistics.mean(lp):.3f} ± {sd(lp):.3f} |")
    # log10 P(bad) where each run's trajectory first reaches a reward level (linear between evaluations)
    levels = [0.50, 0.55, 0.60]
    lines += ["", "log10 P(bad) where the exact expected reward first reaches a level (mean ± sd over the runs "
              "that reach it; runs reaching it / runs):", "",
              "| method | " + " | ".join(f"E[r] = {x:.2f}" for x in levels) + " |",
              "|---|" + "---|" * len(levels)]
    for name, rs in by.items():
        cells = []
        for x in levels:
            hits = [v for v in (at_reward(r["trajectory"], x) for r in rs) if v is not None]
            if hits:
                sd = statistics.stdev(hits) if len(hits) > 1 else 0.0
                cells.append(f"{statistics.mean(hits):.3f} ± {sd:.3f} ({len(hits)}/{len(rs)})")
            else:
                cells.append(f"– (0/{len(rs)})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    ax.scatter([start["expected_reward"]], [start["log10_p_bad"]], marker="*", s=150, c="k", label="start", zorder=3)
    for i, (name, rs) in enumerate(by.items()):
        color = f"C{i}"
        for j, r in enumerate(rs):
            t = r["trajectory"]
            ax.plot([p["expected_reward"] for p in t], [p["log10_p_bad"] for p in t], color=color, alpha=0.35, lw=1)
            ax.scatter([t[-1]["expected_reward"]], [t[-1]["log10_p_bad"]], color=color, s=18,
                       label=name if j == 0 else None)
    ax.set_xlabel("exact expected reward")
    ax.set_ylabel("exact log10 P(bad)")
    ax.set_title("harmlessness toy: exact reward against exact P(bad) during training\n"
                 "(lines: each run's evaluations; dots: the end, the same samples drawn)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "frontier.png"), dpi=120)


def at_reward(trajectory: list[dict], level: float) -> float | None:
    """log10 P(bad) where the trajectory's exact reward first reaches `level` (interpolated)."""
    for a, b in zip(trajectory, trajectory[1:]):
        if a["expected_reward"] < level <= b["expected_reward"]:
            f = (level - a["expected_reward"]) / (b["expected_reward"] - a["expected_reward"])
            return a["log10_p_bad"] + f * (b["log10_p_bad"] - a["log10_p_bad"])
    return None


if __name__ == "__main__":
    main()

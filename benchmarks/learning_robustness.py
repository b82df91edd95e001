"""The learning checks over seeds and CPU kernel settings: does each recipe hold with margin?

    python benchmarks/learning_robustness.py [--seeds 1 2 3 4 5] [--rl_seeds 1 2 3]
        [--settings default avx2 compatible] [--checks quickstart dpo rm grpo ppo ppo_shared ppo_rm] [--out DIR]

For every kernel setting and seed it runs `examples/quickstart.sh` (SEED=<seed>) and reads its
held-out exact match; for the first `--rl_seeds` it then runs the DPO, reward-model and GRPO
learning checks of `tests/rlhf/test_learning.py` (the same command lines, with `--seed`) from that
run's sft model. A kernel setting imitates another CPU by changing the rounding of matmuls or
elementwise kernels:

- default: whatever this machine's torch/MKL pick;
- avx2: `MKL_CBWR=AVX2 ATEN_CPU_CAPABILITY=avx2` (an AVX2-only CPU);
- compatible: `MKL_CBWR=COMPATIBLE` (MKL's portable code path).

Prints one table (check × seed × setting → figure, with wall time) and, per check, min / median /
max over the grid next to the bar the tests assert. Slow (about 7 minutes per quickstart and 3 to
6 per RL check on 2 cores) and not run by CI.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SETTINGS = {
    "default": {},
    "avx2": {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    "compatible": {"MKL_CBWR": "COMPATIBLE"},
}
# the bars: (what the tests assert on one seed, what must hold over the grid)
BARS = {"quickstart": "median ≥ 0.85, worst ≥ 0.70", "dpo": "worst ≥ 0.90", "rm": "worst ≥ 0.90",
        "grpo": "each ≥ +0.10", "ppo": "each ≥ +0.10", "ppo_shared": "each ≥ +0.10", "ppo_rm": "each ≥ +0.10"}


def run_check(check: str, qs: str, out: str, seed: int, env: dict) -> float:
    """One RL learning check from the quickstart output `qs`, in a child process with `env`."""
    code = ("import json, sys; from tests.rlhf import test_learning as t; "
            f"print('RESULT', json.dumps(t.{check}_figure(sys.argv[1], sys.argv[2], seed=int(sys.argv[3]))))")
    proc = subprocess.run([sys.executable, "-c", code, qs, out, str(seed)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{check} (seed {seed}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def run_quickstart(out: str, seed: int, env: dict) -> float:
    """Held-out exact match of `examples/quickstart.sh`; a finished run already in `out` is reused."""
    result = os.path.join(out, "sft", "result.json")
    if not os.path.exists(result):
        proc = subprocess.run(["bash", os.path.join(ROOT, "examples", "quickstart.sh")], cwd=ROOT,
                              env={**env, "OUT": out, "SEED": str(seed)}, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"quickstart (seed {seed}) failed:\n{proc.stderr[-3000:]}")
    with open(result) as f:
        return json.load(f)["metrics"]["eval_acc"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--rl_seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--checks", nargs="+", default=["quickstart", "dpo", "rm", "grpo"], choices=list(BARS))
    p.add_argument("--out", default=os.path.join(ROOT, "output", "learning_robustness"))
    a = p.parse_args()
    rows = []  # (check, seed, setting, figure, seconds)
    for setting in a.settings:
        env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY")}
        env.update(SETTINGS[setting])
        for seed in a.seeds:
            qs = os.path.join(a.out, setting, f"seed{seed}", "qs")
            start = time.time()
            acc = run_quickstart(qs, seed, env)
            rows.append(("quickstart", seed, setting, acc, time.time() - start))
            print(f"quickstart seed {seed} {setting}: {acc:.3f} ({rows[-1][4]:.0f} s)", flush=True)
            if seed not in a.rl_seeds:
                continue
            for check in a.checks:
                if check == "quickstart":
                    continue
                start = time.time()
                figure = run_check(check, qs, os.path.join(a.out, setting, f"seed{seed}", check), seed, env)
                rows.append((check, seed, setting, figure, time.time() - start))
                print(f"{check} seed {seed} {setting}: {figure:+.3f} ({rows[-1][4]:.0f} s)", flush=True)
    figure_name = {"quickstart": "held-out exact match", "dpo": "held-out preference accuracy",
                   "rm": "held-out pairwise accuracy", "grpo": "held-out accuracy gain",
                   "ppo": "held-out accuracy gain", "ppo_rm": "held-out accuracy gain"}
    print("\n| check | seed | setting | figure | seconds |\n|---|---:|---|---:|---:|")
    for check, seed, setting, figure, seconds in rows:
        print(f"| {check} | {seed} | {setting} | {figure:.3f} | {seconds:.0f} |")
    print("\n| check | figure | runs | min | median | max | bar |\n|---|---|---:|---:|---:|---:|---|")
    for check in dict.fromkeys(r[0] for r in rows):
        figures = [r[3] for r in rows if r[0] == check]
        print(f"| {check} | {figure_name[check]} | {len(figures)} | {min(figures):.3f} | "
              f"{statistics.median(figures):.3f} | {max(figures):.3f} | {BARS[check]} |")


if __name__ == "__main__":
    main()

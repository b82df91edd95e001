"""GRPO with the outcome reward alone against outcome + dense process rewards (`--prm_model`), on a
three-step task the built-in tiny model can learn, with a PRM trained on the policy's own checked
steps (docs/grpo.md quotes the tables).

    python benchmarks/process_rewards.py --quickstart output/quickstart [--temperatures 1.5 2.0]
        [--seeds 42 7 1] [--labels cumulative|local] [--weak_policy] [--out DIR]

The task: "a+b+c+d=" (four digits) answered by running sums, one step per line:
"a+b=s1", "s1+c=s2", "s2+d=s3"; the outcome reward is `accuracy` on s3. All 10,000 prompts, 500
held out by a fixed shuffle.
1. policy: `swift sft` (full) from the quickstart's sft model, 400 steps at 1e-3 (cosine), then 800
   at a constant 1e-3, batch 64.
2. PRM data, at each sampling temperature T: the policy samples one answer for each of 8,000
   training prompts (and the 500 held-out ones), whose steps the script labels: `--labels
   cumulative` (default, as `builtin:arith-prm`): a step is right when it and every step before it
   equal the correct steps; `--labels local`: when its own addition continues the step before it.
3. PRM: `swift rlhf --rlhf_type prm` (full) from the policy, 600 steps of 32 at 1e-4; its held-out
   step accuracy is printed beside the majority-label rate. With `--weak_policy`, the policy of
   steps 2 and 4 is the 400-step checkpoint of step 1, and the PRM starts from a stronger model: the
   policy fine-tuned 1,600 more steps (1e-3, cosine).
4. GRPO (LoRA, 60 steps of 16 prompts x 8 answers at 1e-3, temperature T, no KL) with
   `--reward_funcs accuracy`, with and without `--prm_model`; held-out accuracy of sampled answers
   every 10 steps, and the first step at which each arm reaches the target (the outcome arm's
   final accuracy less 0.05, per seed).

Slow (about 25 to 35 minutes with the defaults on 2 cores, `--weak_policy` about 10 more for the
stronger model) and not run by CI.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
from typing import Callable

from prm_learnability import majority_rate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["--gradient_checkpointing", "false", "--add_version", "false", "--report_to", "none",
          "--save_strategy", "no", "--disable_tqdm", "true"]


def prompt_digits(prompt: str) -> list[int]:
    return [int(d) for d in prompt.rstrip("=").split("+")]


def correct_steps(prompt: str) -> list[str]:
    digits = prompt_digits(prompt)
    steps, total = [], digits[0]
    for d in digits[1:]:
        steps.append(f"{total}+{d}={total + d}")
        total += d
    return steps


def write_task(out: str) -> tuple[str, str]:
    rows = []
    for digits in itertools.product(range(10), repeat=4):
        prompt = "+".join(map(str, digits)) + "="
        steps = correct_steps(prompt)
        rows.append({"messages": [{"role": "user", "content": prompt},
                                  {"role": "assistant", "content": "\n".join(steps)}],
                     "solution": steps[-1].split("=")[1]})
    return write_split(rows, out)


def write_split(rows: list[dict], out: str) -> tuple[str, str]:
    """`out`/train.jsonl and `out`/eval.jsonl: 500 rows held out by a fixed shuffle."""
    random.Random(0).shuffle(rows)
    paths = os.path.join(out, "train.jsonl"), os.path.join(out, "eval.jsonl")
    for path, part in zip(paths, (rows[500:], rows[:500])):
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in part)
    return paths


def swift(*argv: str, log: str) -> None:
    """Run `swift ARGV` into a fresh --output_dir (a rerun's logs are appended to, not replaced)."""
    shutil.rmtree(argv[argv.index("--output_dir") + 1], ignore_errors=True)
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, "-m", "swift", *argv], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise SystemExit(f"swift {argv[0]} failed; see {log}")


def logged(run: str, key: str) -> list[tuple[int, float]]:
    with open(os.path.join(run, "logging.jsonl")) as f:
        return [(r["global_step"], r[key]) for r in map(json.loads, f) if key in r]


def sft_argv(train: str, held: str) -> list[str]:
    """Full fine-tuning on the task at 1e-3, greedy exact match on the held-out prompts at each eval."""
    return ["sft", "--tuner_type", "full", "--dataset", train, "--val_dataset", held, "--per_device_train_batch_size",
            "64", "--learning_rate", "1e-3", "--adam_beta2", "0.98", "--predict_with_generate", "true",
            "--generation_max_length", "24", *COMMON]


def train_policy(qs: str, train: str, held: str, out: str) -> str:
    first, policy = os.path.join(out, "policy_400"), os.path.join(out, "policy")
    sft = sft_argv(train, held)
    if not os.path.exists(os.path.join(policy, "model.safetensors")):  # else reuse it
        swift(*sft, "--model", os.path.join(qs, "sft"), "--max_steps", "400", "--warmup_ratio", "0.05",
              "--eval_steps", "400", "--output_dir", first, log=first + ".log")
        swift(*sft, "--model", first, "--max_steps", "800", "--warmup_ratio", "0.02", "--lr_scheduler_type",
              "constant_with_warmup", "--eval_steps", "800", "--output_dir", policy, log=policy + ".log")
    return policy


def train_strong(policy: str, train: str, held: str, out: str) -> str:
    """`--weak_policy`'s PRM base: the policy fine-tuned 1,600 more steps (1e-3, cosine)."""
    strong = os.path.join(out, "policy_strong")
    if not os.path.exists(os.path.join(strong, "model.safetensors")):  # else reuse it
        swift(*sft_argv(train, held), "--model", policy, "--max_steps", "1600", "--warmup_ratio", "0.02",
              "--eval_steps", "800", "--output_dir", strong, log=strong + ".log")
    return strong


STEP = re.compile(r"(\d+)\+(\d)=(\d+)")


def step_labels(prompt: str, steps: list[str], labels: str) -> list[bool]:
    """cumulative: a step is right when it and every step before it equal the correct steps.
    local: a step is right when it adds the next digit of the prompt to the number the step before
    it wrote (the first digit for the first step; a step that is not `x+d=y` writes nothing) and
    writes the sum, whatever came before."""
    want, out, right = correct_steps(prompt), [], True
    if labels == "cumulative":
        for k, step in enumerate(steps):
            right = right and k < len(want) and step == want[k]
            out.append(right)
        return out
    digits = prompt_digits(prompt)
    previous = digits[0]
    for k, step in enumerate(steps):
        m = STEP.fullmatch(step)
        out.append(bool(m) and k + 1 < len(digits) and m.group(1) == str(previous)
                   and int(m.group(2)) == digits[k + 1] and m.group(3) == str(previous + digits[k + 1]))
        if m:
            previous = int(m.group(3))
    return out


def label_samples(policy: str, source: str, out: str, temperature: float, limit: int,
                  label: Callable[[str, list[str]], list[bool]], max_new_tokens: int = 24) -> None:
    """One sampled answer per prompt, its steps labelled by `label(prompt, steps)`."""
    import torch

    from swift.model import load_model

    torch.manual_seed(0)
    model, tok, _ = load_model(policy)
    model.eval()
    tok.padding_side = "left"
    with open(source) as f:
        prompts = [json.loads(line)["messages"][0]["content"] for line in f][:limit]
    with open(out, "w") as f:
        for i in range(0, len(prompts), 256):
            batch = prompts[i:i + 256]
            text = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                            tokenize=False) for p in batch]
            enc = tok(text, return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                gen = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                     max_new_tokens=max_new_tokens)
            answers = tok.batch_decode(gen[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
            for prompt, answer in zip(batch, answers):
                if not answer.strip():
                    continue
                steps = answer.split("\n")
                f.write(json.dumps({"prompt": prompt, "completions": steps,
                                    "labels": label(prompt, steps)}) + "\n")


def train_prm(policy: str, train: str, held: str, out: str, lr: str = "1e-4", steps: int = 600) -> float:
    swift("rlhf", "--rlhf_type", "prm", "--model", policy, "--dataset", train, "--val_dataset", held, "--tuner_type",
          "full", "--learning_rate", lr, "--adam_beta2", "0.98", "--warmup_ratio", "0.02", "--lr_scheduler_type",
          "constant_with_warmup", "--max_steps", str(steps), "--per_device_train_batch_size", "32", "--eval_strategy",
          "steps", "--eval_steps", str(steps // 4), "--logging_steps", "50", *COMMON, "--output_dir", out,
          log=out + ".log")
    return logged(out, "eval_step_accuracy")[-1][1]


def grpo(policy: str, train: str, held: str, out: str, temperature: float, seed: int, *extra: str,
         reward: tuple[str, ...] = ("--reward_funcs", "accuracy"), metric: str = "accuracy", eval_steps: int = 10,
         max_length: int = 24) -> tuple:
    """The held-out curves of the reward `metric` and of the answers' length."""
    swift("rlhf", "--rlhf_type", "grpo", "--model", policy, "--dataset", train, "--val_dataset", held, "--tuner_type",
          "lora", *reward, "--num_generations", "8", "--per_device_train_batch_size", "128",
          "--max_completion_length", str(max_length), "--temperature", str(temperature), "--beta", "0",
          "--learning_rate", "1e-3", "--warmup_ratio", "0.05", "--max_steps", "60", "--eval_on_start", "true",
          "--eval_steps", str(eval_steps), "--logging_steps", str(eval_steps), "--seed", str(seed), "--data_seed", str(seed), *COMMON,
          "--output_dir", out, *extra, log=out + ".log")
    return logged(out, f"eval_rewards/{metric}/mean"), logged(out, "eval_completions/mean_length")


def report(seed: int, curves: dict[str, tuple]) -> None:
    """One table row per arm: its held-out curve, the first step at the target (the outcome arm's final
    accuracy less 0.05) and the answers' length at the first and last evaluation."""
    target = curves["outcome"][0][-1][1] - 0.05
    for name, (curve, length) in curves.items():
        # the accuracies are logged in float32: a tie with the target counts as reached
        first = next((str(step) for step, acc in curve if acc >= target - 1e-6), "not reached")
        print(f"| {seed} | {name} | {' '.join(f'{acc:.3f}' for _, acc in curve)} | {first} (target "
              f"{target:.3f}) | {length[0][1]:.1f} → {length[-1][1]:.1f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quickstart", default=os.path.join(ROOT, "output", "quickstart"))
    p.add_argument("--temperatures", type=float, nargs="+", default=[1.5, 2.0])
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 7, 1])
    p.add_argument("--labels", choices=["cumulative", "local"], default="cumulative", help=step_labels.__doc__)
    p.add_argument("--weak_policy", action="store_true",
                   help="GRPO from the policy's 400-step checkpoint, and the PRM (trained on that checkpoint's "
                        "samples) from a stronger one: the policy fine-tuned 1,600 more steps")
    p.add_argument("--out", default=os.path.join(ROOT, "output", "process_rewards"))
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    train, held = write_task(a.out)
    policy = prm_base = train_policy(a.quickstart, train, held, a.out)
    if a.weak_policy:
        policy, prm_base = os.path.join(a.out, "policy_400"), train_strong(policy, train, held, a.out)
        print(f"PRM base: greedy exact match {logged(prm_base, 'eval_acc')[-1][1]:.3f} on the 500 held-out prompts")
    print(f"policy: greedy exact match {logged(policy, 'eval_acc')[-1][1]:.3f} on the 500 held-out prompts")
    for t in a.temperatures:
        tag = f"T{t:g}" + ("_local" if a.labels == "local" else "") + ("_weak" if a.weak_policy else "")
        prm_train, prm_held = (os.path.join(a.out, f"prm_{tag}_{s}.jsonl") for s in ("train", "eval"))
        label = functools.partial(step_labels, labels=a.labels)
        label_samples(policy, train, prm_train, t, 8000, label)
        label_samples(policy, held, prm_held, t, 500, label)
        prm = os.path.join(a.out, f"prm_{tag}")
        accuracy = train_prm(prm_base, prm_train, prm_held, prm)
        print(f"\nT={t:g}, {a.labels} labels: PRM held-out step accuracy {accuracy:.3f}, "
              f"majority-label rate {majority_rate(prm_held):.3f}")
        print("| seed | reward | held-out accuracy at steps 0, 10, ..., 60 | first step at the target | sampled length "
              "(tokens), steps 0 → 60 |\n|---|---|---|---|---|")
        for seed in a.seeds:
            curves = {"outcome": grpo(policy, train, held, os.path.join(a.out, f"grpo_{tag}_{seed}_outcome"), t, seed),
                      "outcome + process": grpo(policy, train, held, os.path.join(a.out, f"grpo_{tag}_{seed}_process"),
                                                t, seed, "--prm_model", prm)}
            report(seed, curves)


if __name__ == "__main__":
    main()

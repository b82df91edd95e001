"""One prepared check of the GPU paths on a machine with one CUDA GPU (run by scripts/gpu_check.sh).

Each path runs as its own process (a `swift` command, or a short script for the log-prob and TRL
comparisons) with a time limit; the line printed for it is

    PASS|FAIL|SKIP  <path>  <seconds> s  peak <MiB> MiB  <detail>

where the peak is the most GPU memory in use while it ran (nvidia-smi, sampled every 0.2 s, less
what was in use before it started). At the end a markdown block gives the rows for README's
"Verified on" table. Without CUDA it prints one line and exits 2 before running anything.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "builtin:tiny-chat"
SMOKE = ["--model", MODEL, "--torch_dtype", "bfloat16", "--per_device_train_batch_size", "16",
         "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
         "--add_version", "false", "--gradient_checkpointing", "false"]
SFT = ["sft", *SMOKE, "--dataset", "builtin:arith-sft#640", "--max_steps", "40", "--learning_rate", "2e-3"]
ONLINE = ["--dataset", "builtin:arith-sft#64", "--reward_funcs", "accuracy", "--max_completion_length", "8",
          "--max_steps", "3"]
HARMLESS = ["--rlhf_type", "harmless", "--dataset", "builtin:toy-harm", "--reward_funcs", "toy_harm",
            "--num_generations", "16", "--max_completion_length", "2", "--target_dist_beta", "-10", "--alpha", "10",
            "--max_steps", "3"]
# name -> (argv after `swift`, extra environment, what the README row calls it, what a pass checks)
PATHS = {
    "sft_full_bf16": (SFT + ["--tuner_type", "full"], {}, "bf16 `swift sft`, full", "loss falls"),
    "sft_lora_bf16": (SFT + ["--tuner_type", "lora", "--learning_rate", "1e-2"], {}, "bf16 `swift sft`, LoRA",
                      "loss falls"),
    "dpo": (["rlhf", *SMOKE, "--rlhf_type", "dpo", "--dataset", "builtin:arith-dpo#64", "--max_steps", "4"], {},
            "`swift rlhf` DPO", "finite loss"),
    "grpo": (["rlhf", *SMOKE, "--rlhf_type", "grpo", *ONLINE, "--num_generations", "4"], {},
             "`swift rlhf` GRPO, built-in engine", "finite loss"),
    "ppo": (["rlhf", *SMOKE, "--rlhf_type", "ppo", *ONLINE], {}, "`swift rlhf` PPO, built-in engine",
            "finite loss"),
    "zero2": (SFT + ["--tuner_type", "full", "--max_steps", "10", "--deepspeed", "zero2"], {"NPROC_PER_NODE": "1"},
              "DeepSpeed ZeRO-2, one rank", "finite loss"),
    "zero3": (SFT + ["--tuner_type", "full", "--max_steps", "10", "--deepspeed", "zero3"], {"NPROC_PER_NODE": "1"},
              "DeepSpeed ZeRO-3, one rank", "finite loss"),
    "fsdp2": (SFT + ["--tuner_type", "full", "--max_steps", "10", "--fsdp", "fsdp2"], {"NPROC_PER_NODE": "1"},
              "FSDP2, one rank", "finite loss"),
    "qlora": (SFT + ["--tuner_type", "lora", "--quant_bits", "4", "--max_steps", "10"], {}, "QLoRA 4-bit",
              "finite loss"),
    "liger": (SFT + ["--tuner_type", "full", "--use_liger_kernel", "true", "--max_steps", "10"], {},
              "`--use_liger_kernel`", "finite loss"),
    "harmless_copy": (["rlhf", *SMOKE, *HARMLESS, "--tuner_type", "full", "--proposal", "copy"], {},
                      "`swift rlhf --rlhf_type harmless` (RePULSe), full, the proposal a second copy", "finite loss"),
    "harmless_adapter": (["rlhf", *SMOKE, *HARMLESS, "--tuner_type", "lora", "--proposal", "adapter"], {},
                         "`swift rlhf --rlhf_type harmless` (RePULSe), LoRA, the proposal a second adapter",
                         "finite loss"),
}
NEEDS = {"zero2": "deepspeed", "zero3": "deepspeed", "qlora": "bitsandbytes", "liger": "liger_kernel",
         "trl_grpo": "trl", "trl_dpo": "trl", "real_shape": "trl", "red_team": "nanogcg"}
SCRIPTS = {  # name -> (README row, what a pass checks)
    "chunked_logps": ("chunked log-probs at Qwen2.5-0.5B's shape against full logits", "equal within 2e-2"),
    "trl_grpo": ("GRPO step against TRL (benchmarks/memory.py)", "both ran"),
    "trl_dpo": ("DPO step against TRL (benchmarks/memory.py)", "both ran"),
    "real_shape": ("SFT full/LoRA, DPO and GRPO steps at Qwen2.5-0.5B's shape against TRL (benchmarks/real_shape.py)",
                   "all eight runs finished (the speed and memory ratios are printed)"),
    "red_team": ("`bash examples/red_team.sh` (sft, infer, `swift attack` BEAST and GCG, `swift estimate` exact, "
                 "ITGIS, brute force)", "48/48 held out; ITGIS and brute force within 10% of exact"),
}


class PeakMemory:
    """The most GPU memory in use (nvidia-smi, MiB) while the block runs, less what was in use before."""

    def __init__(self):
        self.base = self.peak = self._used()
        self._stop = threading.Event()

    @staticmethod
    def _used() -> int:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True)
        return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout.strip() else 0

    def _watch(self):
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self._used())

    def __enter__(self):
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._used())

    @property
    def mib(self) -> int:
        return self.peak - self.base


def losses(out: str) -> list[float]:
    path = os.path.join(out, "logging.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r["loss"] for r in map(json.loads, f) if "loss" in r]


def judge(name: str, out: str) -> tuple[bool, str]:
    found = losses(out)
    if not found or not all(math.isfinite(x) for x in found):
        return False, f"losses {found[:3]}…"
    if PATHS[name][3] == "loss falls":
        first, last = found[0], sum(found[-5:]) / len(found[-5:])
        return last < first, f"loss {first:.3f} → {last:.3f}"
    return True, f"{len(found)} steps, last loss {found[-1]:.4f}"


CHUNKED = r'''
import json, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
import swift.rlhf.logps as logps

torch.manual_seed(0)
config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                     num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                     max_position_embeddings=32768)  # Qwen2.5-0.5B's shape, random weights
model = Qwen2ForCausalLM(config).to("cuda", torch.bfloat16)
ids = torch.randint(0, 151936, (4, 2048), device="cuda")
targets = ids[:, 1:]

def run(chunked):
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
    if chunked:
        with logps.hidden_states_out(model) as head:
            hidden = model(input_ids=ids).logits[:, :-1]
            per_token, _ = logps.head_logps(hidden, head, targets)
    else:
        _, _, per_token = logps.target_logps(model(input_ids=ids).logits[:, :-1], targets)
    per_token.sum().backward()
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return per_token.detach().float(), (torch.cuda.max_memory_allocated() - base) / 2**20

full, full_mib = run(False)
chunked, chunked_mib = run(True)
diff = (full - chunked).abs().max().item()
print("RESULT " + json.dumps({"max_abs_diff": diff, "full_mib": full_mib, "chunked_mib": chunked_mib}))
'''


def run_script(name: str, out: str, limit: int) -> tuple[bool, str]:
    if name == "chunked_logps":
        proc = subprocess.run([sys.executable, "-c", CHUNKED], capture_output=True, text=True, timeout=limit, cwd=out)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not lines:
            return False, (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        r = json.loads(lines[-1][7:])
        return r["max_abs_diff"] < 2e-2, (f"max |diff| {r['max_abs_diff']:.2e}; forward+backward peak "
                                          f"{r['full_mib']:.0f} MiB full logits, {r['chunked_mib']:.0f} MiB chunked")
    if name == "red_team":
        return run_red_team(out, limit)
    if name == "real_shape":  # eight fresh processes, each loading the model: twice the usual limit
        proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "benchmarks", "real_shape.py")], cwd=out,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=2 * limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its child process too, which would hold the GPU
            proc.communicate()
            return False, f"still running after {2 * limit} s"
        with open(os.path.join(out, "real_shape.txt"), "w") as f:
            f.write(stdout + stderr)
        rows = [x for x in stdout.splitlines() if x.startswith(("| SFT", "| DPO", "| GRPO"))]
        return proc.returncode == 0 and len(rows) == 4, " ; ".join(" ".join(r.split()) for r in rows) or (
            stderr.strip().splitlines() or ["no output"])[-1][:200]
    task = name.split("_")[1]
    length = "256" if task == "grpo" else "1024"  # GRPO's completions run to the limit: decoding dominates
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "memory.py"), "--only", task,
                           "--length", length, "--rows", "8", "--steps", "3"], capture_output=True, text=True,
                          timeout=limit, cwd=out)
    rows = [x for x in proc.stdout.splitlines() if x.startswith(f"| {task} |")]
    with open(os.path.join(out, "memory.txt"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    ok = proc.returncode == 0 and len(rows) == 2 and not any("failed" in r for r in rows)
    return ok, " ; ".join(" ".join(r.split()) for r in rows) or (proc.stderr.strip().splitlines() or ["no output"])[-1]


def run_red_team(out: str, limit: int) -> tuple[bool, str]:
    """examples/red_team.sh at its full size, with `swift` on PATH as this Python's `-m swift`."""
    bin_dir = os.path.join(out, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    with open(os.path.join(bin_dir, "swift"), "w") as f:
        f.write(f'#!/bin/sh\nexec "{sys.executable}" -m swift "$@"\n')
    os.chmod(os.path.join(bin_dir, "swift"), 0o755)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"], "OUT": os.path.join(out, "run")}
    proc = subprocess.run(["bash", os.path.join(ROOT, "examples", "red_team.sh")], capture_output=True, text=True,
                          timeout=limit, cwd=out, env=env)
    with open(os.path.join(out, "red_team.txt"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode:
        return False, (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
    estimates = {m: json.load(open(os.path.join(out, "run", f"estimate_{m}.json"))) for m in ("exact", "itgis",
                                                                                            "bruteforce")}
    exact = estimates["exact"]["estimate"]
    close = all(abs(estimates[m]["estimate"] - exact) <= 0.1 * exact for m in ("itgis", "bruteforce"))
    lines = [x for x in proc.stdout.splitlines() if x.startswith(("held-out", "beast:", "gcg:", "estimate "))]
    return "held-out answers as trained: 48/48" in proc.stdout and close, " ; ".join(lines)


def importable(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=[*PATHS, *SCRIPTS], help="run these paths only")
    p.add_argument("--out", help="keep each path's output here (default: a temporary directory)")
    p.add_argument("--limit", type=int, default=150, help="seconds one path may take")
    p.add_argument("--budget", type=int, default=540,
                   help="seconds for all paths: a path not started by then is skipped (the rows still print)")
    a = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False): nothing was run")
        return 2
    device = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    print(f"gpu_check on {device}", flush=True)
    preflight = subprocess.run([sys.executable, "-c", "import transformers, datasets, peft, swift.pipelines.rlhf"],
                               capture_output=True, text=True)
    if preflight.returncode:
        print("gpu_check: swift does not import here: " + (preflight.stderr.strip().splitlines() or ["?"])[-1])
        return 1
    base = a.out or tempfile.mkdtemp(prefix="gpu_check-")
    results, started = [], time.time()
    for name in a.only or [*PATHS, *SCRIPTS]:
        out = os.path.join(base, name)
        os.makedirs(out, exist_ok=True)
        if time.time() - started > a.budget:
            results.append((name, "SKIP", 0.0, 0, f"not started: the {a.budget} s budget was spent"))
        elif name in NEEDS and not importable(NEEDS[name]):
            results.append((name, "SKIP", 0.0, 0,
                            f"{NEEDS[name]} is not installed (not carried: scripts/gpu_wheels.sh)"))
        else:
            start = time.time()
            with PeakMemory() as memory:
                try:
                    if name in PATHS:
                        argv, env, _, _ = PATHS[name]
                        proc = subprocess.run([sys.executable, "-m", "swift", *argv, "--output_dir", out],
                                              env={**os.environ, **env}, capture_output=True, text=True,
                                              timeout=a.limit, cwd=out)
                        with open(os.path.join(out, "stderr.txt"), "w") as f:
                            f.write(proc.stderr)
                        ok, detail = judge(name, out) if proc.returncode == 0 else \
                            (False, (proc.stderr.strip().splitlines() or ["no output"])[-1][:200])
                    else:
                        ok, detail = run_script(name, out, a.limit)
                except subprocess.TimeoutExpired:
                    ok, detail = False, f"still running after {a.limit} s"
            results.append((name, "PASS" if ok else "FAIL", time.time() - start, memory.mib, detail))
        name, status, seconds, mib, detail = results[-1]
        line = f"{status:4}  {name:14} {seconds:6.1f} s  peak {mib:6d} MiB  {detail}"
        print(line, flush=True)
        with open(os.path.join(base, "results.txt"), "a") as f:  # kept if the whole call is cut short
            f.write(line + "\n")
    day = time.strftime("%Y-%m-%d")
    print("\nVerified-on rows (README):\n")
    for name, status, seconds, mib, detail in results:
        what = PATHS[name][2] if name in PATHS else SCRIPTS[name][0]
        where = f"scripts/gpu_check.sh, {device}" if status != "SKIP" else "–"
        state = {"PASS": f"passed, {seconds:.0f} s, peak {mib} MiB", "FAIL": f"FAILED: {detail}",
                 "SKIP": "not yet verified: " + detail}[status]
        print(f"| {what} | {where} | {day if status != 'SKIP' else '–'} | {state} |")
    return 0 if all(status != "FAIL" for _, status, *_ in results) else 1


if __name__ == "__main__":
    sys.exit(main())

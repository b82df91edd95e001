"""How much sooner `swift sft` starts training on a cached dataset than on its rows.

    python benchmarks/cached_dataset_start.py [--repeats 3]

One cache is written by `swift export --to_cached_dataset` (timed once: the work moved out of every
run), then `swift sft --max_steps 1` runs alternately on the rows (`--dataset ...`) and on the cache
(`--cached_dataset DIR`), same model, flags and seed. The figure is each run's wall time from process
start to its end: imports, model load, reading and encoding the rows (or loading the cache), and one
optimizer step. Medians of `--repeats`, after one untimed run of each. Data: GSM8K's training split (7,473 problems, shared/data) and the built-in
arithmetic rows (9,424), on the built-in tiny model (the tokenizer is a 2,048-token BPE).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks._common import print_config  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
GSM8K = os.path.join(ROOT, "..", "shared", "data", "gsm8k_train.jsonl")
ROWS = ["--dataset", GSM8K, "builtin:arith-sft", "--columns", json.dumps({"question": "query", "answer": "response"})]
COMMON = ["--model", "builtin:tiny-chat", "--max_length", "512"]
TRAIN = ["--max_steps", "1", "--per_device_train_batch_size", "4", "--save_strategy", "no", "--report_to", "none",
         "--disable_tqdm", "true", "--add_version", "false", "--tuner_type", "full"]


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "swift", *argv], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="cached-start-")
    cache = os.path.join(work, "cache")
    rows_run = ["sft", *COMMON, *ROWS, *TRAIN, "--output_dir", os.path.join(work, "rows")]
    cached_run = ["sft", *COMMON, "--cached_dataset", cache, *TRAIN, "--output_dir", os.path.join(work, "cached")]
    print_config({"both": " ".join([*COMMON, *TRAIN])}, {"rows": " ".join(ROWS), "cache": f"--cached_dataset {cache}"},
                 notes=[f"benchmark flags: {vars(a)}", f"cpu count: {os.cpu_count()}"])
    try:
        run(a, cache, rows_run, cached_run)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(a, cache: str, rows_run: list[str], cached_run: list[str]) -> None:
    export_s = timed(["export", *COMMON, *ROWS, "--to_cached_dataset", "true", "--output_dir", cache])
    info = json.load(open(os.path.join(cache, "cache_info.json")))
    timed(rows_run), timed(cached_run)  # warm-up: file caches, imports compiled
    rows, cached = [], []
    for _ in range(a.repeats):
        rows.append(timed(rows_run))
        cached.append(timed(cached_run))
    result = {"train_rows": info["rows"]["train"], "export_s": round(export_s, 2),
              "sft_on_rows_s": round(statistics.median(rows), 2), "sft_on_cache_s": round(statistics.median(cached), 2),
              "speedup": round(statistics.median(rows) / statistics.median(cached), 2),
              "runs": {"rows": [round(x, 2) for x in rows], "cache": [round(x, 2) for x in cached]}}
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""`swift eval --eval_backend EvalScope`: EvalScope (requirements/evalscope.txt) scores the benchmarks
through an OpenAI-compatible endpoint: `--eval_url`, or a `swift deploy` of `--model` started for
the run on a free loopback port with a one-off API key and stopped after it.

Benchmark names are ours (gsm8k, math500, cmath, general_qa, general_mcq) mapped to EvalScope's;
`--eval_dataset_args` goes to EvalScope as its `dataset_args` (e.g. `local_path`, `subset_list`,
`few_shot_num`). EvalScope's own prompts, answer extraction and metrics apply: the figures can
differ from the Native backend's on the same answers."""
from __future__ import annotations

import importlib.util
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from swift.arguments.base import _jsonable, part_fields
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)
NAMES = {"gsm8k": "gsm8k", "math500": "math_500", "math_500": "math_500", "cmath": "cmath",
         "general_qa": "general_qa", "general_mcq": "general_mcq"}
SERVER_PARTS = ("model_args", "template_args", "engine_args")  # what `swift deploy` shares with `swift eval`


def check(a) -> None:
    """Names and the extra, before anything starts."""
    for name in a.eval_dataset:
        if name not in NAMES:
            raise SwiftError(f"--eval_dataset {name}: --eval_backend EvalScope takes the benchmarks "
                             f"{', '.join(sorted(set(NAMES) - {'math_500'}))} (local files through "
                             "--eval_dataset_args '{\"NAME\": {\"local_path\": DIR}}'); arith and bare files are "
                             "scored by the Native backend")
    if importlib.util.find_spec("evalscope") is None:
        raise SwiftError("--eval_backend EvalScope needs evalscope, in an environment of its own: pip install -r "
                         "requirements/evalscope.txt && pip install --no-deps -e . (docs/eval.md)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DeployedModel:
    """`swift deploy` of the eval's model in a child process (EvalScope forks its scorers, so the
    server does not share this process), on loopback with a one-off key."""

    def __init__(self, a, timeout: float = 600.0):
        parts = [getattr(a, name) for name in SERVER_PARTS]
        config = {f.name: _jsonable(getattr(p, f.name)) for p in parts for f in part_fields(type(p))}
        self.api_key = secrets.token_hex(16)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._config = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump(config, self._config, default=str)
        self._config.close()
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "swift", "deploy", "--config", self._config.name, "--host", "127.0.0.1",
             "--port", str(self.port), "--api_key", self.api_key, "--served_model_name", "swift-eval",
             "--log_level", "warning"], stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait(timeout)
        except BaseException:
            self.close()
            raise

    def _wait(self, timeout: float) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log.seek(0)
                tail = self._log.read().decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                raise SwiftError(f"--eval_backend EvalScope: the model server did not start: {tail[0]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise SwiftError(f"--eval_backend EvalScope: the model server was not up after {timeout:.0f}s")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        os.unlink(self._config.name)


def generation_config(config, explicit_max_tokens: bool) -> dict:
    """Our request settings in EvalScope's `generation_config` (its defaults are replaced whole);
    n samples become EvalScope's repeats."""
    g = {"temperature": config.temperature, "top_p": config.top_p, "retries": 1, "retry_interval": 1}
    if explicit_max_tokens:
        g["max_tokens"] = config.max_tokens
    if config.seed is not None:
        g["seed"] = config.seed
    if config.stop:
        g["stop_seqs"] = list(config.stop)
    if config.n > 1:
        g["n"] = config.n
    return g


def run(a, config, explicit_max_tokens: bool, out_dir: str) -> dict[str, dict[str, Any]]:
    """Score every --eval_dataset with EvalScope; per benchmark its primary score (as `acc` when that
    metric is accuracy, else under `score` with the metric's name) and every metric EvalScope reports."""
    from evalscope import TaskConfig, run_task

    server = None
    if a.eval_url:
        url, key, model = a.eval_url, a.api_key or "EMPTY", a.model or "default"
    else:
        if not a.model:
            raise SwiftError("swift eval needs --model (and --adapters) or --eval_url")
        server = DeployedModel(a)
        url, key = server.url, server.api_key
        model = list(a.adapters)[-1] if a.adapters else "swift-eval"
    names = {name: NAMES[name] for name in a.eval_dataset}
    dataset_args = {NAMES[k]: v for k, v in a.eval_args.dataset_args.items() if k in NAMES}
    task = TaskConfig(model=model, api_url=url, api_key=key, eval_type="openai_api",
                      datasets=list(dict.fromkeys(names.values())), dataset_args=dataset_args,
                      eval_batch_size=a.eval_num_proc, limit=a.eval_limit,
                      generation_config=generation_config(config, explicit_max_tokens),
                      work_dir=os.path.join(out_dir, "evalscope"), no_timestamp=True, seed=None)
    try:
        reports = run_task(task_cfg=task)
    except SwiftError:
        raise
    except Exception as e:
        raise SwiftError(f"--eval_backend EvalScope failed: {type(e).__name__}: {e}") from None
    finally:
        if server is not None:
            server.close()
    results = {}
    for name, es_name in names.items():
        report = reports.get(es_name)
        if not report:
            raise SwiftError(f"--eval_dataset {name}: EvalScope scored no samples (see {task.work_dir}/logs)")
        metrics = {m.name: m.score for m in report.metrics}
        primary = report.metrics[0].name if report.metrics else "score"
        total = sum(s.num for m in report.metrics[:1] for c in m.categories for s in c.subsets)
        row = {"benchmark": es_name, "backend": "evalscope", "num_questions": total, "metric": primary,
               "metrics": metrics}
        row["acc" if primary.split(":")[0] in ("acc", "accuracy") else "score"] = report.score
        results[name] = row
    return results

"""`swift eval --eval_backend EvalScope`: EvalScope (requirements/evalscope.txt) scores the benchmarks
through an OpenAI-compatible endpoint: `--eval_url`, or a `swift deploy` of `--model` started for the
run on a free loopback port with a one-off API key (in its 0600 config file, not on its command
line) and stopped after it, or when this process dies.

Benchmark names are ours (gsm8k, math500, cmath, general_qa, general_mcq) mapped to EvalScope's;
`--eval_dataset_args` goes to EvalScope as its `dataset_args` (e.g. `local_path`, `subset_list`,
`few_shot_num`). EvalScope's own prompts, answer extraction and metrics apply: the figures can
differ from the Native backend's on the same answers."""
from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

from swift.arguments.base import part_fields, to_jsonable
from swift.infer.protocol import RequestConfig
from swift.utils.logging import get_logger
from swift.utils.network import free_port
from swift.utils.registry import SwiftError

logger = get_logger(__name__)
NAMES = {"gsm8k": "gsm8k", "math500": "math_500", "math_500": "math_500", "cmath": "cmath",
         "general_qa": "general_qa", "general_mcq": "general_mcq"}
SERVER_PARTS = ("model_args", "template_args", "engine_args")  # what `swift deploy` shares with `swift eval`
SERVED_NAME = "swift-eval"


def check(eval_dataset: list[str]) -> None:
    """Names and the package, before anything starts."""
    for name in eval_dataset:
        if name not in NAMES:
            raise SwiftError(f"--eval_dataset {name}: --eval_backend EvalScope takes the benchmarks "
                             f"{', '.join(sorted(set(NAMES) - {'math_500'}))} (local files through "
                             "--eval_dataset_args '{\"NAME\": {\"local_path\": DIR}}'); arith and bare files are "
                             "scored by the Native backend")
    if importlib.util.find_spec("evalscope") is None:
        raise SwiftError("--eval_backend EvalScope needs evalscope, in an environment of its own: pip install -r "
                         "requirements/evalscope.txt && pip install --no-deps -e . (docs/eval.md)")


def _parent_death_signal():
    """A function for the child (between fork and exec) that asks Linux to send it SIGTERM when
    `swift eval` dies, however it dies; resolved here, before the fork (no imports in the child)."""
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class DeployedModel:
    """`swift deploy` of the eval's model in a child process (EvalScope forks its answer checkers, so
    the server does not share this process) on loopback, behind a one-off key."""

    def __init__(self, config: dict[str, Any], timeout: float = 600.0):
        self.api_key = secrets.token_hex(16)
        self.port = free_port("127.0.0.1")
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.proc: subprocess.Popen | None = None
        self._timeout = timeout
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:  # mode 0600
            json.dump({**config, "api_key": self.api_key, "host": "127.0.0.1", "port": self.port,
                       "served_model_name": SERVED_NAME, "log_level": "warning"}, f)
        self._config = f.name
        self._log = tempfile.TemporaryFile()

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "swift", "deploy", "--config", self._config],
                                     stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=_parent_death_signal())
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log.seek(0)
                tail = self._log.read().decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                raise SwiftError(f"--eval_backend EvalScope: the model server did not start: {tail[0]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    os.unlink(self._config)  # read by now: the key leaves the disk
                    return
            except OSError:
                time.sleep(0.5)
        raise SwiftError(f"--eval_backend EvalScope: the model server was not up after {self._timeout:.0f}s")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if os.path.exists(self._config):
            os.unlink(self._config)


def served_model(url: str, api_key: str | None) -> str:
    """The first model id of `GET <url>/models` (what to ask for when --model is not given)."""
    request = urllib.request.Request(url.rstrip("/") + "/models",
                                     headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise SwiftError(f"--eval_url {url}: cannot list its models ({type(e).__name__}: {e}); pass --model NAME") \
            from None


def generation_config(config: RequestConfig, explicit_max_tokens: bool) -> dict[str, Any]:
    """Our request settings in EvalScope's `generation_config` (its defaults are replaced whole);
    n samples become EvalScope's repeats."""
    g = config.openai_fields(max_tokens=explicit_max_tokens)
    if "stop" in g:
        g["stop_seqs"] = g.pop("stop")
    if g["n"] == 1:
        del g["n"]
    return {**g, "retries": 1, "retry_interval": 1}


def _row(name: str, report) -> dict[str, Any]:
    """One benchmark's result: its primary metric (as `acc` when that is accuracy, else as `score`
    with the metric's name) and every metric EvalScope reports."""
    primary = report.primary_metric
    if primary is None or primary.score is None:
        raise SwiftError(f"--eval_dataset {name}: EvalScope named no primary metric (does a metric_list in "
                         "--eval_dataset_args leave it out?)")
    row = {"benchmark": report.dataset_name, "backend": "evalscope", "num_questions": report.num,
           "metric": primary.name, "metrics": {m.name: m.score for m in report.metrics}}
    row["acc" if primary.name.split(":")[0] in ("acc", "accuracy") else "score"] = primary.score
    return row


def run(a, config: RequestConfig, explicit_max_tokens: bool, out_dir: str) -> dict[str, dict[str, Any]]:
    """Score every --eval_dataset with EvalScope."""
    try:
        from evalscope import TaskConfig, run_task
    except Exception as e:  # installed beside swift's pins (datasets 5), it may not import
        raise SwiftError(f"--eval_backend EvalScope: evalscope does not import here ({type(e).__name__}: {e}); "
                         "give it its own environment (docs/eval.md)") from None

    server = None
    if a.eval_url:
        url, key = a.eval_url, a.api_key or "EMPTY"
        model = a.model or served_model(a.eval_url, a.api_key)
    else:
        if not a.model and not a.adapters:
            raise SwiftError("swift eval needs --model (and --adapters) or --eval_url")
        adapters = a.engine_args.named_adapters()
        parts = [getattr(a, name) for name in SERVER_PARTS]
        server = DeployedModel({f.name: to_jsonable(getattr(p, f.name)) for p in parts for f in part_fields(type(p))})
        url, key, model = server.url, server.api_key, list(adapters)[-1] if adapters else SERVED_NAME
    names = {name: NAMES[name] for name in a.eval_dataset}
    try:
        task = TaskConfig(model=model, api_url=url, api_key=key, eval_type="openai_api",
                          datasets=list(dict.fromkeys(names.values())),
                          dataset_args={NAMES[k]: v for k, v in a.eval_args.dataset_args.items() if k in NAMES},
                          eval_batch_size=a.eval_num_proc or 16, limit=a.eval_limit,
                          generation_config=generation_config(config, explicit_max_tokens),
                          work_dir=os.path.join(out_dir, "evalscope"), no_timestamp=True, seed=None)
        if server is not None:
            server.start()
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
        if not reports.get(es_name):
            raise SwiftError(f"--eval_dataset {name}: EvalScope scored no samples (see {task.work_dir}/logs)")
        results[name] = _row(name, reports[es_name])
    return results

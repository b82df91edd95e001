"""`swift eval`: answer benchmark questions with a model (transformers or vLLM engine) or any
OpenAI-compatible endpoint (`--eval_url`), score them, and write a report."""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

from tqdm import tqdm

from swift.arguments.base import ComposedArguments
from swift.arguments.infer import EngineArguments, GenerationArguments, refuse_vllm_flags
from swift.arguments.model import ModelArguments
from swift.arguments.template import PromptTemplateArguments
from swift.pipelines.base import resolve_args
from swift.utils.io import write_json, write_jsonl
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)
GENERATION_KEYS = {"max_tokens", "max_new_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "n", "seed",
                   "stop", "do_sample"}


def json_flag(value, flag: str) -> dict:
    """A JSON-object flag (a string on the command line, a mapping from a config file)."""
    if value in (None, ""):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise SwiftError(f"{flag}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(value, dict):
        raise SwiftError(f"{flag}: expected a JSON object, got {type(value).__name__}")
    return value


@dataclass
class EvalOptions:
    eval_dataset: list[str] = field(default_factory=list, metadata={
        "help": "Benchmarks (gsm8k, math500, cmath, arith, general_qa, general_mcq) or local files."})
    eval_limit: int | None = field(default=None, metadata={
        "help": "Questions per benchmark (the first N; with --eval_backend EvalScope, per subset, as EvalScope counts: "
                "math500 has 5 levels, cmath 6 grades)."})
    eval_num_proc: int | None = field(default=None, metadata={
        "help": "Requests in flight at once (default: 16 to a server; for a model loaded here, all of them, "
                "batched by --max_batch_size)."})
    eval_output_dir: str = field(default="eval_output", metadata={
        "help": "Reports go to <dir>/<YYYYMMDD-HHMMSS>/ (a new directory per run)."})
    eval_url: str | None = field(default=None, metadata={
        "help": "Evaluate an OpenAI-compatible endpoint (e.g. http://127.0.0.1:8000/v1) instead of loading a model."})
    api_key: str | None = field(default=None, metadata={"help": "Bearer token for --eval_url."})
    eval_backend: str = field(default="Native", metadata={
        "help": "Native (the built-in evaluator) or EvalScope (the evalscope extra, driven through an OpenAI-compatible "
                "endpoint: --eval_url, or a `swift deploy` of --model started for the run)."})
    eval_generation_config: str | None = field(default=None, metadata={
        "help": "JSON: max_tokens, temperature, top_p, top_k, n (samples per question: pass@k), seed, stop."})
    eval_dataset_args: str | None = field(default=None, metadata={
        "help": "JSON {benchmark: {local_path, subset_list, prompt_template}}."})
    strict: bool = field(default=False, metadata={"help": "Stop at a bad row instead of dropping it."})

    def __post_init__(self) -> None:
        if isinstance(self.eval_dataset, str):
            self.eval_dataset = [self.eval_dataset]
        if not self.eval_dataset:
            raise SwiftError("--eval_dataset is required (e.g. gsm8k, arith, or a jsonl/csv file)")
        backend = self.eval_backend.lower()
        if backend in ("opencompass", "vlmevalkit"):
            raise SwiftError(f"--eval_backend {self.eval_backend} is an ms-swift backend this version does not "
                             "support (it has Native and EvalScope)")
        if backend not in ("native", "evalscope"):
            raise SwiftError(f"--eval_backend {self.eval_backend!r} is not one of Native, EvalScope")
        self.eval_backend = backend
        if self.eval_limit is not None and self.eval_limit < 1:
            raise SwiftError("--eval_limit must be at least 1")
        if self.eval_num_proc is not None and self.eval_num_proc < 1:
            raise SwiftError("--eval_num_proc must be at least 1")
        self.generation = json_flag(self.eval_generation_config, "--eval_generation_config")
        unknown = set(self.generation) - GENERATION_KEYS
        if unknown:
            raise SwiftError(f"--eval_generation_config: unknown key {sorted(unknown)[0]!r} "
                             f"(known: {', '.join(sorted(GENERATION_KEYS))})")
        self.dataset_args = json_flag(self.eval_dataset_args, "--eval_dataset_args")
        for name, value in self.dataset_args.items():
            if not isinstance(value, dict):
                raise SwiftError(f"--eval_dataset_args: the value of {name!r} must be an object")


class EvalArguments(ComposedArguments):
    """`swift eval`: score a model or an OpenAI-compatible endpoint on benchmarks."""

    parts: ClassVar[dict[str, type]] = {
        "model_args": ModelArguments,
        "template_args": PromptTemplateArguments,
        "engine_args": EngineArguments,
        "generation_args": GenerationArguments,
        "eval_args": EvalOptions,
    }

    def __post_init__(self) -> None:
        """Refuse what this run does not read: with --eval_url the server loads, templates and
        batches (only --model, picking one of its models, and --use_hf, for the benchmarks' files, are
        read)."""
        if self.eval_url:
            self.refuse_unread(("model_args", "template_args", "engine_args"), {"model", "use_hf", "external_plugins"},
                               f"does nothing with --eval_url: the server at {self.eval_url} loads and runs the model")
        else:
            refuse_vllm_flags(self, self.infer_backend)


def with_generation(config, generation: dict):
    """`config` with an `--eval_generation_config` mapping on top; also whether it set the length."""
    g = dict(generation)
    if "max_new_tokens" in g:
        g.setdefault("max_tokens", g.pop("max_new_tokens"))
    if g.pop("do_sample", True) is False:
        g["temperature"] = 0.0
    if isinstance(g.get("stop"), str):
        g["stop"] = [g["stop"]]
    try:
        return replace(config, **g), "max_tokens" in g
    except (TypeError, ValueError, SwiftError) as e:
        raise SwiftError(f"--eval_generation_config: {e}") from None


def request_config(a: EvalArguments):
    """--temperature/--max_new_tokens/... with --eval_generation_config's keys on top."""
    config, explicit = with_generation(a.generation_args.request_config(), a.eval_args.generation)
    return config, explicit or a.max_new_tokens is not None


class RequestFailed(SwiftError):
    """A request that failed inside the engine (not a refusal of the request)."""


def generate(engine, requests, config, explicit_max_tokens: bool, desc: str, fit=None,
             concurrency: int | None = None) -> list:
    """Every request through the engine concurrently, with a progress bar; a request the engine
    refuses or fails on gives its error instead of a response, and the others go on. When every
    request failed inside the engine (or its server was unreachable or failing), the engine is
    broken: that error is raised. `concurrency`: at most that many requests in the engine at once."""
    from swift.infer.client import ServerFailure

    async def run():
        bar = tqdm(total=len(requests), desc=desc, dynamic_ncols=True)
        gate = asyncio.Semaphore(concurrency or len(requests) or 1)

        async def one(request):
            try:
                r, c = (request, config) if explicit_max_tokens or fit is None else fit(request, config)
                async with gate:
                    return await engine.infer_async(r, c)
            except ServerFailure as e:  # unreachable, or failing: not this request's fault
                return RequestFailed(str(e))
            except SwiftError as e:
                return e
            except Exception as e:  # one failed request scores 0 and never takes its batch mates down
                return RequestFailed(f"{type(e).__name__}: {e}")
            finally:
                bar.update()

        try:
            return await asyncio.gather(*(one(r) for r in requests))
        finally:
            bar.close()

    responses = asyncio.run(run())
    if responses and all(isinstance(r, RequestFailed) for r in responses):
        raise SwiftError(f"{desc}: every request failed in the engine (first: {responses[0]})")
    return responses


def build_eval_engine(a: EvalArguments):
    """The engine: a ClientEngine for --eval_url, else the model in --infer_backend."""
    if a.eval_url:
        from swift.infer.client import ClientEngine

        return ClientEngine(a.eval_url, api_key=a.api_key, model=a.model, concurrency=a.eval_num_proc or 16), None
    from swift.infer.factory import build_engine

    if not a.model and not a.adapters:
        raise SwiftError("swift eval needs --model (and --adapters) or --eval_url")
    engine, adapters = build_engine(a)
    return engine, (list(adapters)[-1] if adapters else None)


def load_benchmarks(a: EvalArguments) -> dict[str, tuple]:
    """Every --eval_dataset's questions, read before any model loads (a bad name or row stops first)."""
    from swift.eval.benchmarks import load_questions

    loaded = {}
    for name in a.eval_dataset:
        if name.startswith("verifiers:"):
            loaded[name] = _verifiers_rows(a, name)
            continue
        loaded[name] = load_questions(name, args=a.eval_args.dataset_args.get(name), use_hf=a.use_hf,
                                      limit=a.eval_limit, strict=a.strict)
        if loaded[name][2]:
            logger.warning(f"{name}: dropped {len(loaded[name][2])} rows (first: {loaded[name][2][0]})")
    return loaded


def _verifiers_rows(a: EvalArguments, name: str) -> tuple:
    """A verifiers environment's eval rows (`verifiers:<env>[?kwargs][:train|eval][#N]`)."""
    from swift.dataset.loader import DatasetSpec
    from swift.rollout import verifiers_env

    if a.eval_url:
        raise SwiftError(f"--eval_dataset {name}: a verifiers environment runs its rollouts with a local model "
                         "(--model), not through --eval_url")
    spec = DatasetSpec.parse(name)
    if spec.subset not in (None, "train", "eval"):
        raise SwiftError(f"--eval_dataset {name}: subset '{spec.subset}' is not one of train, eval")
    rows = [row for _, row in verifiers_env.iter_rows(spec.source, spec.subset or "eval", spec.n)]
    return "verifiers", rows[:a.eval_limit] if a.eval_limit else rows, []  # --eval_limit caps, as elsewhere


VERIFIERS_BUDGET = 256  # tokens after the prompt when --max_new_tokens is not given


def evaluate_verifiers(engine, name: str, rows: list[dict], config, adapter: str | None,
                       explicit: bool) -> tuple[list[dict], dict]:
    """Each row through its environment's own rollout (`config.n` per row, `--max_new_tokens` (default
    256) the budget of every token after the prompt); scores are the rubric's totals."""
    from dataclasses import replace

    from swift.rollout.multi_turn import RolloutInferRequest
    from swift.rollout.verifiers_env import VerifiersRollout

    requests = [RolloutInferRequest(list(r["messages"]), {k: v for k, v in r.items() if k != "messages"}) for r in rows]
    budget = config.max_tokens if explicit else VERIFIERS_BUDGET
    trajectories = VerifiersRollout(engine, engine.template, replace(config, n=1, max_tokens=budget), budget,
                                    adapter=adapter)(requests, config.n)
    out, scores, functions = [], [], {}
    for i, row in enumerate(rows):
        group = trajectories[i * config.n:(i + 1) * config.n]
        values = [t.rollout_infos.get("verifiers_reward") for t in group]
        scores.append([0.0 if v is None else v for v in values])
        for t in group:
            for key, value in t.rollout_infos.items():
                if key.startswith("verifiers/"):
                    functions.setdefault(key, []).append(value)
        out.append({"id": i, "origin": f"{name} row {i + 1}", "prompt": row["messages"], "gold": row.get("solution"),
                    "responses": [t.text for t in group], "completions": [t.messages[len(row["messages"]):] for t in group],
                    "scores": scores[-1], **({"errors": [t.rollout_infos["rollout_error"] for t in group
                                                         if "rollout_error" in t.rollout_infos]}
                                             if any("rollout_error" in t.rollout_infos for t in group) else {})})
    flat = [v for row in scores for v in row]
    summary = {"score": sum(flat) / max(len(flat), 1),
               **{k: sum(v) / len(v) for k, v in sorted(functions.items())}}
    return out, summary


def evaluate(engine, a: EvalArguments, adapter: str | None, benchmarks: dict[str, tuple], out_dir: str) -> dict:
    """Each benchmark: questions → responses → scores; per-sample jsonl; metrics per benchmark."""
    from swift.eval.benchmarks import extract, score
    from swift.eval.metrics import summarize
    from swift.infer.protocol import InferRequest
    from swift.pipelines.infer import fit_to_context

    config, explicit = request_config(a)
    fit = None if a.eval_url else (lambda r, c: fit_to_context(engine, r, c, None))
    if a.eval_url:  # no length given: the server's default (swift deploy, vLLM: the rest of the context)
        engine.omit_max_tokens = not explicit
    results, files = {}, set()
    for name, (bench, questions, dropped) in benchmarks.items():
        if bench == "verifiers":
            started = time.perf_counter()
            rows, summary = evaluate_verifiers(engine, name, questions, config, adapter, explicit)
            stem = _stem(name, files)
            write_jsonl(os.path.join(out_dir, f"{stem}.jsonl"), rows)
            results[name] = {"benchmark": "verifiers", "kind": "rubric", "file": f"{stem}.jsonl",
                             "num_questions": len(rows), "num_samples": config.n, "dropped_rows": 0,
                             "errors": sum(len(r.get("errors", [])) for r in rows),
                             "seconds": round(time.perf_counter() - started, 3), **summary}
            continue
        requests = [InferRequest(messages=q.messages, adapter=adapter) for q in questions]
        started = time.perf_counter()
        responses = generate(engine, requests, config, explicit, desc=f"eval {name}", fit=fit,
                             concurrency=a.eval_num_proc)  # a client engine caps its own requests as well
        seconds = time.perf_counter() - started
        rows, scores, errors = [], [], 0
        for q, response in zip(questions, responses):
            failed = isinstance(response, SwiftError)
            texts = [""] * config.n if failed else [c.text for c in response.choices]
            errors += failed
            sample_scores = [score(bench.kind, t, q.gold, **q.extra) for t in texts]
            scores.append(sample_scores)
            rows.append({"id": q.id, "origin": q.origin, "prompt": q.messages, "gold": q.gold,
                         "responses": texts, "extracted": [extract(bench.kind, t, **q.extra) for t in texts],
                         "scores": sample_scores, **({"error": str(response)} if failed else {})})
        stem = _stem(name, files)
        write_jsonl(os.path.join(out_dir, f"{stem}.jsonl"), rows)
        results[name] = {"benchmark": bench.name, "kind": bench.kind, "file": f"{stem}.jsonl",
                         "num_questions": len(questions),
                         "num_samples": config.n, "dropped_rows": len(dropped), "errors": errors,
                         "seconds": round(seconds, 3), **summarize(scores)}
        if errors:
            first = next(r["error"] for r in rows if "error" in r)
            logger.warning(f"{name}: {errors} questions failed and score 0 (first: {first})")
    return results


def _stem(name: str, files: set) -> str:
    """The per-sample file's name: two of the same name (from different directories) get -1, -2, ..."""
    base = re.sub(r"[^\w.+-]", "_", _safe(name))  # verifiers:env.py?n=4 -> env.py_n_4
    stem, k = base, 1
    while stem in files:
        stem, k = f"{base}-{k}", k + 1
    files.add(stem)
    return stem


def _safe(name: str) -> str:
    """A benchmark's name, or a data file's name without its extension."""
    stem, ext = os.path.splitext(os.path.basename(name.rstrip("/")))
    return (stem if ext.lower() in (".jsonl", ".json", ".csv", ".parquet", ".txt") else stem + ext) or "dataset"


def new_run_dir(root: str) -> str:
    """<root>/<YYYYMMDD-HHMMSS>, with -1, -2, ... when that exists: an earlier report is never overwritten."""
    base = os.path.join(root, time.strftime("%Y%m%d-%H%M%S"))
    path, i = base, 0
    while True:
        try:
            os.makedirs(path)
            return path
        except FileExistsError:
            i += 1
            path = f"{base}-{i}"


def table(results: dict[str, dict]) -> str:
    keys = sorted({k for r in results.values() for k in r if k in ("acc", "score") or k.startswith(("pass@", "mean@"))},
                  key=lambda k: (k not in ("acc", "score"), len(k), k))
    head = ["dataset", "n_questions", *keys]
    lines = [head] + [[name, str(r["num_questions"]), *(f"{r[k]:.4f}" if k in r else "-" for k in keys)]
                      for name, r in results.items()]
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    fmt = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    return "\n".join([fmt(lines[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(fmt, lines[1:])])


def bar_chart(results: dict[str, dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, ax = plt.subplots(figsize=(max(4, 1.4 * len(names)), 3.5))
    bars = ax.bar(names, [results[n].get("acc", results[n].get("score")) or 0.0 for n in names], color="#4C72B0")
    ax.bar_label(bars, fmt="%.3f")
    ax.set_ylim(0, max([1.05] + [1.1 * (results[n].get("acc", results[n].get("score")) or 0.0) for n in names]))
    ax.set_ylabel("accuracy" if all("acc" in r for r in results.values()) else "score")
    ax.set_title("swift eval")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def eval_main(args: EvalArguments | list[str] | None = None) -> dict[str, Any]:
    a = resolve_args(EvalArguments, args, "swift eval")
    if os.path.exists(a.eval_output_dir) and not os.path.isdir(a.eval_output_dir):
        raise SwiftError(f"--eval_output_dir {a.eval_output_dir}: a file, not a directory")
    config, _ = request_config(a)  # a bad generation config stops here, before any model loads
    if config.n > 1 and not config.temperature:
        logger.warning(f"n={config.n} samples per question with temperature 0 are all the same greedy answer: "
                       "pass@k equals acc (set temperature in --eval_generation_config)")
    if a.eval_backend == "evalscope":
        from swift.eval import evalscope_backend

        evalscope_backend.check(a.eval_dataset)

        def score(out_dir: str) -> dict:
            return evalscope_backend.run(a, *request_config(a), out_dir)
    else:
        benchmarks = load_benchmarks(a)
        engine, adapter = build_eval_engine(a)

        def score(out_dir: str) -> dict:
            try:
                return evaluate(engine, a, adapter, benchmarks, out_dir)
            finally:
                engine.close()
    out_dir = new_run_dir(a.eval_output_dir)
    try:
        results = score(out_dir)
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)  # this run's own directory: no report, no half of one
        raise
    config, _ = request_config(a)
    report = {"results": results, "backend": a.eval_backend, "model": a.model, "adapters": list(a.adapters),
              "eval_url": a.eval_url,
              "infer_backend": None if a.eval_url else a.infer_backend, "generation": asdict(config),
              "config": {k: v for k, v in a.to_dict().items() if k != "api_key"}}
    write_json(os.path.join(out_dir, "report.json"), report)
    bar_chart(results, os.path.join(out_dir, "report.png"))
    print(table(results))
    logger.info(f"report: {os.path.join(out_dir, 'report.json')}")
    return {"output_dir": out_dir, **report}

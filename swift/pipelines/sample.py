"""`swift sample`: best-of-n and rejection sampling (ms-swift's names), and distillation from an
OpenAI-compatible teacher.

For every prompt row of --dataset: generate --num_return_sequences answers (or take the row's own
answer with --sampler_engine no), score them — an outcome reward (--orm_model, a reward function
name such as `accuracy`), a process reward model (--prm_model, answers below --prm_threshold are
dropped) and/or a sequence-classification reward model (--reward_model), summed — skip prompts the
model already solves in more than --easy_query_threshold of its answers, and write:

- <output_file>: the --n_best_to_keep best distinct answers per prompt, one row each, in ms-swift's
  layout: {"messages": prompt + answer, "rejected_response": the worst answer (on rows that score
  more than --pair_min_margin above it), "score", "rejected_score", "row_index", the row's other
  columns} —
  `swift sft` input (it reads `messages`);
- <stem>_pairs.jsonl: per prompt only its best row, and only when it has a `rejected_response` —
  `swift rlhf --rlhf_type dpo` input in which every row is a pair.

--data_range I N takes the I-th of N contiguous shards of the rows (several processes, one file
each); --resume skips the prompts <stem>_progress.jsonl records as complete (nothing lost or
repeated) and refuses to continue files written from other data, seed, shard, model, adapters,
template, sampling or scoring settings.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tqdm import tqdm

from swift.arguments.base import ComposedArguments
from swift.arguments.infer import EngineArguments, GenerationArguments, refuse_vllm_flags
from swift.arguments.model import ModelArguments
from swift.arguments.template import PromptTemplateArguments, refuse_prompt_limit
from swift.pipelines.base import resolve_args
from swift.pipelines.eval import json_flag
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)
ENGINES = ("transformers", "vllm", "client", "no")


@dataclass
class SampleOptions:
    dataset: list[str] = field(default_factory=list, metadata={"help": "Prompt rows (messages/query, plus columns rewards read, e.g. solution)."})
    sampler_type: str = field(default="sample", metadata={"help": "sample (best-of-n / rejection sampling) or distill (a teacher's answers)."})
    sampler_engine: str = field(default="transformers", metadata={
        "help": "transformers (ms-swift: pt), vllm, client (an OpenAI-compatible URL in --engine_kwargs), "
                "or no (score the rows' own answers)."})
    num_return_sequences: int = field(default=64, metadata={"help": "Answers generated per prompt."})
    n_best_to_keep: int = field(default=5, metadata={"help": "Best distinct answers kept per prompt."})
    orm_model: str | None = field(default=None, metadata={"help": "Outcome reward: a reward function name (e.g. accuracy) or a .py file."})
    prm_model: str | None = field(default=None, metadata={"help": "A process reward model directory (swift rlhf --rlhf_type prm)."})
    prm_threshold: float = field(default=0.0, metadata={"help": "Drop answers whose weakest step scores below this."})
    reward_model: str | None = field(default=None, metadata={"help": "A sequence-classification reward model directory."})
    step_separator: str = field(default="\n", metadata={"help": "--prm_model: the text that ends each step."})
    easy_query_threshold: float | None = field(default=None, metadata={
        "help": "Skip a prompt when more than this fraction of its answers earn the outcome reward (>= 1)."})
    pair_min_margin: float = field(default=0.0, metadata={"help": "A chosen/rejected pair needs best − worst > this."})
    data_range: list[int] = field(default_factory=list, metadata={"help": "I N: the I-th of N contiguous shards of the rows."})
    num_sampling_batch_size: int = field(default=8, metadata={"help": "Prompts sent to the engine together."})
    num_sampling_batches: int | None = field(default=None, metadata={"help": "Stop after this many batches."})
    resume: bool = field(default=False, metadata={"help": "Continue an interrupted run: skip prompts already written."})
    override_exist_file: bool = field(default=False, metadata={"help": "Replace an existing output file."})
    output_dir: str = field(default="sample_output", metadata={"help": "Directory of the output files."})
    output_file: str | None = field(default=None, metadata={
        "help": "Output jsonl name (default: sample.jsonl, or sample_I_of_N.jsonl with --data_range)."})
    engine_kwargs: str | None = field(default=None, metadata={
        "help": "JSON; client engine: base_url, api_key, model, concurrency."})
    strict: bool = field(default=False, metadata={"help": "Stop at a bad row instead of dropping it."})

    def __post_init__(self) -> None:
        if isinstance(self.dataset, str):
            self.dataset = [self.dataset]
        if not self.dataset:
            raise SwiftError("--dataset is required: the prompts to sample answers for")
        if self.sampler_type == "mcts":
            raise SwiftError("--sampler_type mcts is an ms-swift sampler this version does not support (it has sample "
                             "and distill)")
        if self.sampler_type not in ("sample", "distill"):
            raise SwiftError(f"--sampler_type {self.sampler_type!r} is not one of sample, distill")
        if self.sampler_engine == "pt":
            self.sampler_engine = "transformers"
        if self.sampler_engine == "lmdeploy":
            raise SwiftError("--sampler_engine lmdeploy is an ms-swift engine this version does not support (it has "
                             f"{', '.join(ENGINES)})")
        if self.sampler_engine not in ENGINES:
            raise SwiftError(f"--sampler_engine {self.sampler_engine!r} is not one of {', '.join(ENGINES)}")
        self.engine_options = json_flag(self.engine_kwargs, "--engine_kwargs")
        if self.sampler_type == "distill" and self.sampler_engine != "client":
            raise SwiftError("--sampler_type distill asks a teacher behind an OpenAI-compatible API: "
                             "--sampler_engine client --engine_kwargs '{\"base_url\": ...}'")
        if self.sampler_engine == "client" and not self.engine_options.get("base_url"):
            raise SwiftError("--sampler_engine client needs --engine_kwargs '{\"base_url\": \"http://host:port/v1\"}'")
        if self.num_return_sequences < 1 or self.n_best_to_keep < 1:
            raise SwiftError("--num_return_sequences and --n_best_to_keep must be at least 1")
        if self.data_range:
            if len(self.data_range) != 2 or not 0 <= self.data_range[0] < self.data_range[1]:
                raise SwiftError(f"--data_range {' '.join(map(str, self.data_range))}: give I N with 0 <= I < N")
        if self.orm_model == "math":  # ms-swift's sampling examples name the math-answer outcome reward so
            self.orm_model = "accuracy"
        if self.easy_query_threshold is not None and not self.orm_model:
            raise SwiftError("--easy_query_threshold counts answers that earn the outcome reward: give --orm_model")
        unread = []
        if self.sampler_type == "distill":  # the teacher's answers are kept unscored
            unread = [("orm_model", None), ("prm_model", None), ("reward_model", None), ("easy_query_threshold", None),
                      ("pair_min_margin", 0.0), ("prm_threshold", 0.0), ("step_separator", "\n")]
            why = "does nothing with --sampler_type distill (the teacher's answers are kept unscored)"
        elif not self.prm_model:
            unread = [("prm_threshold", 0.0), ("step_separator", "\n")]
            why = "applies to --prm_model's scores; there is no --prm_model"
        for name, default in unread:
            if getattr(self, name) != default:
                raise SwiftError(f"--{name} {why}")
        if self.sampler_engine == "no" and self.num_return_sequences != 64:
            raise SwiftError("--num_return_sequences does nothing with --sampler_engine no (each row's own answer is "
                             "scored)")
        if self.resume and self.override_exist_file:
            raise SwiftError("--resume continues the existing output file; --override_exist_file replaces it: give one")


class SampleArguments(ComposedArguments):
    """`swift sample`: best-of-n / rejection sampling and distillation into training data."""

    parts: ClassVar[dict[str, type]] = {
        "model_args": ModelArguments,
        "template_args": PromptTemplateArguments,
        "engine_args": EngineArguments,
        "generation_args": GenerationArguments,
        "sample_args": SampleOptions,
    }
    defaults: ClassVar[dict[str, Any]] = {"temperature": 1.0}  # as ms-swift: sampling, not greedy

    def __post_init__(self) -> None:
        """Refuse what this run does not read: a client engine's server loads and runs the model
        (--model picks one of its models; --template is the reward and process models' template).
        Without --seed, ms-swift's 42: an unseeded run is reproducible and resumable too."""
        if self.seed is None:
            self.seed = 42
        if self.sampler_engine == "client":
            served = self.sample_args.engine_options.get("model")
            if served and self.model and served != self.model:
                raise SwiftError(f"--model {self.model} and --engine_kwargs model {served}: give the served model once")
            self.refuse_unread(("model_args", "engine_args"), {"model", "use_hf", "external_plugins"},
                               "does nothing with --sampler_engine client: the server loads and runs the model")
        if self.sampler_engine != "client":  # (client: every engine flag is refused above)
            if self.infer_backend not in ("transformers", self.sampler_engine):
                raise SwiftError(f"--infer_backend {self.infer_backend}: swift sample's engine is --sampler_engine "
                                 f"(this run: {self.sampler_engine}); give --sampler_engine {self.infer_backend}")
            refuse_vllm_flags(self, self.sampler_engine)
        if self.sampler_engine in ("client", "no"):
            refuse_prompt_limit(self, f"with --sampler_engine {self.sampler_engine} nothing is encoded here to generate")


SamplingArguments = SampleArguments  # ms-swift's name


def shard(n: int, index: int, total: int) -> range:
    """The index-th of `total` contiguous, near-equal shards of range(n)."""
    return range(n * index // total, n * (index + 1) // total)


def output_paths(a) -> tuple[str, str]:
    name = a.output_file or ("sample.jsonl" if not a.data_range else f"sample_{a.data_range[0]}_of_{a.data_range[1]}.jsonl")
    if os.path.basename(name) != name or not name.endswith(".jsonl"):
        raise SwiftError(f"--output_file {name}: a file name ending in .jsonl (the directory is --output_dir)")
    path = os.path.join(a.output_dir, name)
    return path, path[:-len(".jsonl")] + "_pairs.jsonl"


def valid_rows(path: str) -> list[dict]:
    """The complete rows of an output file (a line cut short by an interruption is not one)."""
    rows = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return rows


def side_paths(path: str) -> dict[str, str]:
    stem = path[:-len(".jsonl")]
    return {"pairs": stem + "_pairs.jsonl", "skipped": stem + "_skipped.jsonl", "progress": stem + "_progress.jsonl"}


# settings that change which answers a run writes (model, adapters, template, sampling, scoring),
# besides the data: a resumed run must agree on each; the rest only steer the run
NOT_IN_FINGERPRINT = frozenset({"use_hf", "check_model", "attn_impl", "max_batch_size", "vllm_gpu_memory_utilization",
                                "vllm_enforce_eager", "num_sampling_batches", "num_sampling_batch_size", "resume",
                                "override_exist_file", "output_dir", "output_file", "strict"})
ENGINE_OPTIONS_NOT_IN_FINGERPRINT = frozenset({"concurrency", "timeout", "max_retries"})


def fingerprint(a, n_rows: int) -> dict:
    """What decides which prompt a `row_index` names and what is written for it: a resumed run must
    agree on all of it (values as JSON keeps them)."""
    settings = {f.name: getattr(a, f.name) for part in SampleArguments.parts.values() for f in dataclasses.fields(part)
                if f.name not in NOT_IN_FINGERPRINT}
    settings.update(seed=a.seed, rows=n_rows)
    # under its own key: files of earlier versions recorded --max_length 2048 when no version read it
    limit, cut = settings.pop("max_length"), settings.pop("truncation_strategy")
    settings["prompt_max_length"] = None if limit is None else f"{limit} ({cut})"
    # the server a client engine asks, not its key (the file is no place for secrets) nor how it is asked
    settings["engine_kwargs"] = {k: v for k, v in a.sample_args.engine_options.items()
                                 if not k.endswith(("key", "token")) and k not in ENGINE_OPTIONS_NOT_IN_FINGERPRINT}
    return json.loads(json.dumps(settings, default=str))


def prepare_resume(path: str, expected: dict) -> set:
    """The prompts finished before an interruption: those named in the progress file, which gets a
    prompt's line only after all its rows, its pair and its skip reason were written. The output
    files are rewritten without the rows of any other prompt (half-written ones are sampled again)."""
    side = side_paths(path)
    records = valid_rows(side["progress"])
    if not records or "fingerprint" not in records[0]:
        raise SwiftError(f"--resume: {side['progress']} is missing, so which prompts of {path} are complete is "
                         "unknown; --override_exist_file true starts again")
    written = records[0]["fingerprint"]
    # a setting the file does not record (written by an earlier version) is not checked
    differ = sorted(k for k in expected if k in written and written[k] != expected[k])
    if differ:
        what = ", ".join(f"--{k} {written.get(k)!r} (now {expected.get(k)!r})" for k in differ if k != "rows")
        if "rows" in differ:
            what = ", ".join(x for x in (what, f"{written.get('rows')} rows (now {expected.get('rows')})") if x)
        raise SwiftError(f"--resume: {path} was written with other settings: {what}; give the same ones, or "
                         "another --output_file")
    done = {r["row_index"] for r in records[1:] if "row_index" in r}
    for p in (path, side["pairs"], side["skipped"]):
        if os.path.exists(p):
            rewrite(p, [r for r in valid_rows(p) if r.get("row_index") in done])
    rewrite(side["progress"], [records[0], *({"row_index": i} for i in sorted(done))])  # no cut last line
    return done


def rewrite(path: str, rows: list[dict]) -> None:
    """The file holds exactly `rows` (written beside it, then moved over it: never half of them)."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    os.replace(path + ".tmp", path)


def append_rows(path: str, rows: list[dict]) -> None:
    """One write per prompt, so an interruption cuts at most its last line."""
    if rows:
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


class Scorer:
    """Sums the configured rewards for each answer; an answer under --prm_threshold gets None."""

    def __init__(self, a):
        from swift.rewards.manager import RewardManager, build_reward_funcs

        # as in GRPO: async functions awaited, None read as "no reward for this answer", a failure named
        self.orm = RewardManager(build_reward_funcs([a.orm_model], a)) if a.orm_model else None
        self.rm = build_reward_funcs([], a, reward_model=a.reward_model)[0][1] if a.reward_model else None
        self.prm = None
        if a.prm_model:
            from swift.eval.prm import PRMScorer

            self.prm = PRMScorer(a.prm_model, step_separator=a.step_separator, template_name=a.template)
        self.threshold = a.prm_threshold

    def __call__(self, messages: list[dict], answers: list[str], columns: dict) -> tuple[list, list]:
        """(total score or None per answer, outcome reward per answer — NaN where the function gave
        None — or None without --orm_model)."""
        n = len(answers)
        cols = {k: [v] * n for k, v in columns.items()}
        from swift.rewards.manager import whole_conversations

        # ms-swift's columns: `messages` the conversation with the answer last, the prompt as `prompt_messages`
        outcome = self.orm(answers, whole_conversations(answers, {**cols, "messages": [messages] * n}))[1][0] \
            if self.orm else None
        totals = [0.0] * n
        if outcome:
            totals = [t + o for t, o in zip(totals, outcome)]
        if self.rm:
            totals = [t + r for t, r in zip(totals, self.rm(answers, messages=[messages] * n))]
        if self.prm:
            process = [self.prm.score(messages, x) for x in answers]
            totals = [None if p < self.threshold else t + p for t, p in zip(totals, process)]
        return totals, outcome


def select(messages, answers, totals, outcome, a) -> tuple[list[dict], dict | None, str | None]:
    """The kept rows, the pair, or why the prompt was skipped. As in ms-swift's output, a kept answer
    scoring more than --pair_min_margin above the worst carries the worst as `rejected_response`."""
    if a.easy_query_threshold is not None and outcome:
        solved = sum(1 for o in outcome if o >= 1.0) / len(outcome)
        if solved > a.easy_query_threshold:
            return [], None, "easy"
    scored = [(t, x) for t, x in zip(totals, answers) if t is not None and not math.isnan(t) and x.strip()]
    if not scored:
        return [], None, "no answer passed the filters"
    best: dict[str, float] = {}
    for t, x in scored:  # distinct answers, each with its best score
        best[x] = max(t, best.get(x, -math.inf))
    ranked = sorted(best.items(), key=lambda kv: -kv[1])
    worst, low = ranked[-1]
    kept = []
    for x, t in ranked[:a.n_best_to_keep]:
        row = {"messages": [*messages, {"role": "assistant", "content": x}], "score": t}
        if t - low > a.pair_min_margin:
            row["rejected_response"], row["rejected_score"] = worst, low
        kept.append(row)
    pair = kept[0] if "rejected_response" in kept[0] else None
    return kept, pair, None


def build_sample_engine(a):
    if a.sampler_engine == "no":
        return None, None
    if a.sampler_engine == "client":
        from swift.infer.client import ClientEngine

        o = a.sample_args.engine_options
        return ClientEngine(o["base_url"], api_key=o.get("api_key"), model=o.get("model") or a.model,
                            concurrency=int(o.get("concurrency", 16)), flag="--engine_kwargs base_url"), None
    from swift.infer.factory import build_engine

    a.engine_args.infer_backend = a.sampler_engine
    engine, adapters = build_engine(a)
    return engine, (list(adapters)[-1] if adapters else None)


def prompt_of(row: dict) -> tuple[list[dict], str | None]:
    """The conversation to answer and, when the row ends with one, its own answer."""
    messages = list(row["messages"])
    if messages[-1]["role"] == "assistant":
        return messages[:-1], messages[-1]["content"]
    return messages, None


def sample_main(args: SampleArguments | list[str] | None = None) -> dict[str, Any]:
    from dataclasses import replace

    from swift.dataset.loader import load_rows

    a = resolve_args(SampleArguments, args, "swift sample")
    if os.path.exists(a.output_dir) and not os.path.isdir(a.output_dir):
        raise SwiftError(f"--output_dir {a.output_dir}: a file, not a directory")
    rows = load_rows(a.dataset, strict=a.strict, seed=a.seed, use_hf=a.use_hf)
    rows.report("sample dataset")
    indices = list(shard(len(rows), *a.data_range) if a.data_range else range(len(rows)))
    path, pairs_path = output_paths(a)
    side = side_paths(path)
    skipped_path, progress_path = side["skipped"], side["progress"]
    existing = [p for p in (path, *side.values()) if os.path.exists(p)]
    if existing and not (a.resume or a.override_exist_file):
        raise SwiftError(f"{existing[0]} exists; --resume continues it, --override_exist_file replaces it")
    named = next((rows.origins[i] for i, r in enumerate(rows.rows) if "row_index" in r), None)
    if named:
        raise SwiftError(f"{named}: a 'row_index' column, which swift sample writes (the prompt's index); rename that "
                         "column")
    expected = fingerprint(a, len(rows))
    finished = prepare_resume(path, expected) if a.resume and existing else set()
    todo = [i for i in indices if i not in finished]
    if a.num_sampling_batches is not None:
        todo = todo[:a.num_sampling_batches * a.num_sampling_batch_size]
    if a.sampler_engine == "no":  # every row must bring the answer to score: checked before any is written
        missing = next((rows.origins[i] for i in todo if prompt_of(rows.rows[i])[1] is None), None)
        if missing:
            raise SwiftError(f"--sampler_engine no scores the rows' own answers; {missing} has none")
    # bad sampling settings, reward names or models stop the run before the engine loads and
    # before any file is touched
    config = replace(a.generation_args.request_config(), n=1 if a.sampler_engine == "no" else a.num_return_sequences)
    scorer = Scorer(a)
    engine, adapter = build_sample_engine(a)
    if a.sampler_engine == "client":  # no --max_new_tokens: the server's default length
        engine.omit_max_tokens = a.max_new_tokens is None
    try:
        os.makedirs(a.output_dir, exist_ok=True)
        if a.override_exist_file:
            for p in existing:
                os.remove(p)
        if not os.path.exists(progress_path):
            append_rows(progress_path, [{"fingerprint": expected}])
        counts = _sample(a, rows, todo, engine=engine, adapter=adapter, config=config,
                         scorer=scorer, paths=(path, pairs_path, skipped_path, progress_path))
    finally:
        if engine is not None:
            engine.close()
    logger.info(f"sample: {counts['prompts']} prompts → {counts['kept']} rows in {path}, {counts['pairs']} pairs in "
                f"{pairs_path}; skipped {counts['skipped_easy']} easy, {counts['skipped_other']} without a usable answer"
                + (f"; {counts['failed']} failed (warned above, not written: --resume tries them again)"
                   if counts["failed"] else ""))
    return {"output_file": path, "pairs_file": pairs_path, **counts}


def _sample(a, rows, todo, *, engine, adapter, config, scorer, paths) -> dict:
    """Generate, score and write each prompt of `todo`, in batches; the counts."""
    from swift.infer.protocol import InferRequest
    from swift.pipelines.eval import generate
    from swift.pipelines.infer import fit_to_context

    path, pairs_path, skipped_path, progress_path = paths
    counts = {"prompts": 0, "kept": 0, "pairs": 0, "skipped_easy": 0, "skipped_other": 0, "failed": 0}
    failures: list[str] = []

    def fail(i: int, error: SwiftError) -> None:
        """A prompt that failed (its request, or scoring its answers): stop under --strict, else warn."""
        if a.strict:
            raise SwiftError(f"{rows.origins[i]}: {error}")
        logger.warning(f"{rows.origins[i]}: {error}")
        failures.append(f"{rows.origins[i]}: {error}")
    bar = tqdm(total=len(todo), desc="sample", dynamic_ncols=True)
    try:
        for start in range(0, len(todo), a.num_sampling_batch_size):
            batch = todo[start:start + a.num_sampling_batch_size]
            prompts = [prompt_of(rows.rows[i]) for i in batch]
            if engine is None:
                missing = next((rows.origins[i] for i, (_, own) in zip(batch, prompts) if own is None), None)
                if missing:
                    raise SwiftError(f"--sampler_engine no scores the rows' own answers; {missing} has none")
                answers = [[own] for _, own in prompts]
            else:
                requests = [InferRequest(messages=m, adapter=adapter) for m, _ in prompts]
                fit = None if a.sampler_engine == "client" else (lambda r, c: fit_to_context(engine, r, c, None))
                responses = generate(engine, requests, config, a.max_new_tokens is not None, desc="generate", fit=fit)
                answers = []
                for i, response in zip(batch, responses):
                    if isinstance(response, SwiftError):
                        fail(i, response)
                        answers.append(None)
                    else:
                        answers.append([c.text for c in response.choices])
            for i, (messages, _), texts in zip(batch, prompts, answers):
                counts["prompts"] += 1
                if texts is None:
                    counts["failed"] += 1
                    continue
                columns = {k: v for k, v in rows.rows[i].items() if k != "messages"}
                if a.sampler_type == "distill":
                    kept, pair, why = [{"messages": [*messages, {"role": "assistant", "content": t}], "score": None}
                                       for t in dict.fromkeys(texts) if t.strip()][:a.n_best_to_keep], None, None
                else:
                    try:
                        totals, outcome = scorer(messages, texts, columns)
                    except SwiftError as e:  # this prompt's answers could not be scored: the others go on
                        fail(i, e)
                        counts["failed"] += 1
                        continue
                    kept, pair, why = select(messages, texts, totals, outcome, a)
                extra = {k: v for k, v in columns.items() if k not in ("rejected_response",)}
                if pair:
                    append_rows(pairs_path, [{**extra, **pair, "row_index": i}])
                append_rows(path, [{**extra, **row, "row_index": i} for row in kept])
                if why:
                    append_rows(skipped_path, [{"row_index": i, "reason": why}])
                append_rows(progress_path, [{"row_index": i}])  # last: the prompt is complete
                counts["kept"] += len(kept)
                counts["pairs"] += pair is not None
                counts["skipped_easy" if why == "easy" else "skipped_other"] += why is not None
                bar.update()
            if counts["failed"] == counts["prompts"]:  # a whole first batch failed: no point sampling on
                raise SwiftError(f"swift sample: every prompt failed (first: {failures[0]})")
    finally:
        bar.close()
    return counts

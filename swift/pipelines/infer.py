"""`swift infer`: an interactive terminal chat, or batch inference over a dataset to jsonl."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from dataclasses import dataclass, field
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

COMMANDS = "commands: clear (new conversation), reset-system, multi-line (end input with '#'), exit"


@dataclass
class InferOptions:
    val_dataset: list[str] = field(default_factory=list, metadata={
        "help": "Batch mode: run every row of these datasets and write --result_path (no dataset: interactive chat)."})
    result_path: str | None = field(default=None, metadata={"help": "Batch mode output jsonl (default: infer_result.jsonl)."})
    metric: str | None = field(default=None, metadata={"help": "Batch mode score per row against the reference: acc or rouge."})
    stream: bool = field(default=True, metadata={"help": "Interactive mode: print tokens as they are generated."})
    strict: bool = field(default=False, metadata={"help": "Stop at a bad row (one the dataset loader or the engine refuses) instead of skipping it."})

    def __post_init__(self) -> None:
        if isinstance(self.val_dataset, str):
            self.val_dataset = [self.val_dataset]
        if self.metric not in (None, "acc", "rouge"):
            raise SwiftError(f"--metric {self.metric!r} is not one of acc, rouge")


class InferArguments(ComposedArguments):
    """`swift infer`: interactive chat, or batch inference over --val_dataset."""

    parts: ClassVar[dict[str, type]] = {
        "model_args": ModelArguments,
        "template_args": PromptTemplateArguments,
        "engine_args": EngineArguments,
        "generation_args": GenerationArguments,
        "infer_args": InferOptions,
    }

    def __post_init__(self) -> None:
        """Refuse, in one line each, what this run would not read (before 2026-11-29 these flags were
        accepted and ignored): the shared engine and generation parts also serve deploy, eval,
        sample and app, which read some flags this command does not."""
        self._refuse_model_flags()
        if self.top_logprobs and not self.logprobs:
            raise SwiftError("--top_logprobs needs --logprobs true (the alternatives come with each token's log-prob)")
        if self.val_dataset:
            if not self.stream:
                raise SwiftError("--stream false applies to the interactive chat; batch mode (--val_dataset) writes "
                                 "whole answers")
            return
        # (before 2026-12-07 --result_path alone was accepted, as the web console passed it to every run)
        self.refuse_unread(("infer_args",), {"val_dataset", "stream"},
                           "applies to batch mode only: give --val_dataset (without it swift infer is a chat)")
        if self.logprobs:
            raise SwiftError("--logprobs: the interactive chat does not show log-probs; batch mode (--val_dataset) "
                             "writes them into each result row")

    @staticmethod
    def outputs_read(values: dict[str, Any]) -> set[str]:
        """The output flags a run with these flag values reads (the web console sets those): batch
        mode's --result_path."""
        return {"result_path"} if values.get("val_dataset") else set()

    def _refuse_model_flags(self) -> None:
        """Model, adapter and engine flags this command would not read."""
        if self.task_type != "causal_lm" or self.num_labels is not None:
            flag = f"--task_type {self.task_type}" if self.task_type != "causal_lm" else "--num_labels"
            raise SwiftError(f"{flag}: swift infer generates with a causal LM; a reward model (seq_cls) is served by "
                             "`swift deploy --task_type seq_cls`")
        if len(self.adapters) > 1:
            # `named_adapters` would also fold two bare paths with one directory name into one entry
            raise SwiftError(f"--adapters: swift infer applies one adapter to every request, got {len(self.adapters)}; "
                             "fold them into one model with `swift merge-lora --adapters A B` (applied in order), or "
                             "serve each by name with `swift deploy --adapters a=A b=B`")
        refuse_vllm_flags(self, self.infer_backend)


def _adapter(adapters: dict[str, str]) -> str | None:
    # infer applies its one adapter (more are refused by InferArguments) to every request
    return next(iter(adapters), None)


# what answers depend on beyond the model and generation settings; in the resume record when set
# away from its default (before 2026-11-30 only the first three were)
ENGINE_RECORD = ("infer_backend", "torch_dtype", "quant_bits", "model_type", "model_revision", "use_hf", "attn_impl",
                 "quant_method", "bnb_4bit_compute_dtype", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
                 "bnb_4bit_quant_storage", "vllm_max_model_len")


def batch_infer(a: InferArguments, engine, adapter: str | None) -> dict[str, Any]:
    """Every row of --val_dataset through the engine. Each result is appended to --result_path as
    it finishes (so an interrupted run keeps what it did, and the same command again continues where
    it stopped); a row the engine refuses is reported by file and row and skipped, or stops the run
    with --strict. At the end the file is rewritten in dataset order and a summary is written."""
    from swift.dataset.loader import load_rows

    rows = load_rows(a.val_dataset, strict=a.strict, use_hf=a.use_hf, flag="--val_dataset")
    rows.report("val dataset")
    config = a.generation_args.request_config()
    path = a.result_path or "infer_result.jsonl"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    run = {"val_dataset": list(a.val_dataset), "model": a.model, "adapters": list(a.adapters),
           "template": a.template, "system": a.system,
           "generation": {**dataclasses.asdict(config), "max_tokens": a.max_new_tokens}, "num_rows": len(rows)}
    # recorded only when given: files of earlier runs still resume
    if a.max_length is not None:
        run["prompt_max_length"] = [a.max_length, a.truncation_strategy]
    defaults = {f.name: f.default for part in InferArguments.parts.values() for f in dataclasses.fields(part)
                if f.name in ENGINE_RECORD}
    backend = {k: getattr(a, k) for k in ENGINE_RECORD if getattr(a, k) != defaults[k]}
    if backend:  # another engine, model revision, dtype or quantization answers otherwise
        run["engine"] = backend
    done = _resume(path, run, rows.origins)
    if done:
        logger.info(f"{path}: {len(done)} of {len(rows)} rows already done; continuing with the other "
                    f"{len(rows) - len(done)}")
    failed: dict[str, str] = {}  # a failed row's origin -> its error, in the order they failed
    answered_before = len(done)
    with open(path, "a", encoding="utf-8") as out:
        asyncio.run(_run_rows(a, engine, adapter, rows, config, done, failed, out))
    lines = [done[i] for i in sorted(done)]
    write_jsonl(path + ".tmp", lines)  # dataset order, replaced atomically
    os.replace(path + ".tmp", path)
    summary = {"result_path": path, "num_rows": len(lines), "num_failed": len(failed)}
    if failed:
        summary["failed"] = list(failed)
    if a.metric:
        scored = [line[a.metric] for line in lines if a.metric in line]
        summary[a.metric] = sum(scored) / max(len(scored), 1)
    write_json(os.path.splitext(path)[0] + "_summary.json", summary)
    print(json.dumps(summary))
    if failed and len(lines) == answered_before:
        # every row this run tried failed (as they do when the engine died): not a run that worked
        earlier = f"; {answered_before} answered by an earlier run" if answered_before else ""
        origin, reason = next(iter(failed.items()))
        first = (reason.strip().splitlines() or [""])[0]
        raise SwiftError(f"--val_dataset: every row this run tried failed ({len(failed)}{earlier}); the first, "
                         f"{origin}: {first}")
    return summary


async def _run_rows(a: InferArguments, engine, adapter: str | None, rows, config, done: dict[int, dict],
                    failed: dict[str, str], out) -> None:
    """The rows not in `done`, concurrently: each result written to `out` and added to `done`; a
    failed row's origin and error added to `failed` (with --strict the first one stops the run)."""
    from swift.infer.metrics import METRICS
    from swift.infer.protocol import InferRequest

    path = a.result_path or "infer_result.jsonl"
    score = METRICS.get(a.metric) if a.metric else None
    bar = tqdm(total=len(rows), initial=len(done), desc="infer")

    async def one(i: int) -> None:
        try:
            # a row without a conversation (say, {"text": ...}) is that row's failure, not the run's
            prompt, reference = _prompt_and_reference(rows.rows[i])
            request, row_config = fit_to_context(
                engine, InferRequest(messages=prompt, tools=rows.rows[i].get("tools"), adapter=adapter), config,
                a.max_new_tokens)
            response = await engine.infer_async(request, row_config)
        except Exception as e:  # noqa: BLE001 - any failure of one row is that row's
            if not isinstance(e, SwiftError):
                e = SwiftError(f"{type(e).__name__}: {e}")
            if a.strict:
                raise SwiftError(f"{rows.origins[i]}: {e} (results so far are in {path}; run with --strict "
                                 "false to skip such rows)") from None
            logger.warning(f"{rows.origins[i]}: {e} (row skipped)")
            failed[rows.origins[i]] = str(e)
            bar.update()
            return
        line = _result_line(i, rows.origins[i], prompt, reference, response, a.logprobs)
        if score is not None and reference is not None:
            line[a.metric] = score(line["response"], reference)
        out.write(json.dumps(line, ensure_ascii=False) + "\n")
        out.flush()
        done[i] = line
        bar.update()

    tasks = [asyncio.ensure_future(one(i)) for i in range(len(rows)) if i not in done]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()  # on --strict's first error the other rows stop; their results are not lost
        bar.close()


def _prompt_and_reference(row: dict) -> tuple[list[dict], str | None]:
    """The conversation to answer, and the reference: its last turn when that is the assistant's."""
    messages = row.get("messages")
    if not messages:
        raise SwiftError(f"no conversation to answer (the row has {', '.join(sorted(row)) or 'no columns'}); batch "
                         "mode takes messages or query/response rows")
    reference = messages[-1]["content"] if messages[-1]["role"] == "assistant" else None
    return (messages[:-1] if reference is not None else messages), reference


def _result_line(i: int, origin: str, prompt: list[dict], reference: str | None, response,
                 logprobs: bool) -> dict[str, Any]:
    choice = response.choices[0]
    line = {"index": i, "origin": origin, "messages": prompt, "response": choice.text, "reference": reference,
            "finish_reason": choice.finish_reason, "usage": response.usage}
    if logprobs:
        line["logprobs"] = _chat_logprobs(choice.logprobs or [])
    return line


def _chat_logprobs(items: list) -> dict[str, list]:
    """The answer's log-probs as OpenAI's chat `logprobs` ({"content": [...]}, the shape `swift
    deploy` answers with): each token's text, log-prob and bytes, and its top alternatives."""
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode()),
                         "top_logprobs": [{"token": s, "logprob": v, "bytes": list(s.encode())}
                                          for s, v in t.top_logprobs]} for t in items]}


def _resume(path: str, run: dict, origins: list[str]) -> dict[int, dict]:
    """Results already in `path` from the same run (same datasets, model, adapters, template and
    generation settings, kept in `<path>_run.json`, and each kept row from the same file and row),
    by row index. Results of another run are never overwritten."""
    meta = os.path.splitext(path)[0] + "_run.json"
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        write_json(meta, run)
        return {}
    previous = json.load(open(meta, encoding="utf-8")) if os.path.exists(meta) else None
    if previous != run:
        what = "no record of the run that wrote it" if previous is None else "results of another run (" + ", ".join(
            k for k in {**previous, **run} if previous.get(k) != run.get(k)) + " differ)"
        raise SwiftError(f"--result_path {path} already exists with {what}; pass another --result_path, or delete "
                         "the file to start again")
    done, keep = {}, 0
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break  # the last line of an interrupted run may be cut short
            line = json.loads(raw)
            i = line.get("index")
            if not isinstance(i, int) or not 0 <= i < len(origins) or line.get("origin") != origins[i]:
                raise SwiftError(f"--result_path {path}: its row {line.get('index')} ({line.get('origin')}) is not "
                                 "a row of this dataset any more; pass another --result_path, or delete the file")
            done[i] = line
            keep += len(raw)
    with open(path, "r+b") as f:
        f.truncate(keep)
    return done


def _read_query(multi_line: bool) -> str:
    if not multi_line:
        return input("<<< ")
    lines = []
    prompt = "<<<[M] "
    while True:
        line = input(prompt)
        if prompt and line.strip() in ("exit", "clear", "reset-system", "multi-line"):
            return line  # commands still work as the first line of a multi-line input
        prompt = ""
        if line.endswith("#"):
            lines.append(line[:-1])
            return "\n".join(lines)
        lines.append(line)


def interactive(a: InferArguments, engine, adapter: str | None) -> dict[str, Any]:
    from swift.infer.protocol import InferRequest

    config = a.generation_args.request_config()
    system = a.system
    history: list[dict] = []
    multi_line = False
    print(COMMANDS, flush=True)
    while True:
        try:
            query = _read_query(multi_line)
        except EOFError:
            break
        command = query.strip()
        if command == "exit":
            break
        if command == "clear":
            history = []
            print("(conversation cleared)", flush=True)
            continue
        if command == "reset-system":
            try:
                system = input("new system prompt: ")
            except EOFError:  # end of input here ends the chat, as at the prompt
                break
            history = []
            continue
        if command == "multi-line":
            multi_line = True
            print("(multi-line mode: end your input with '#')", flush=True)
            continue
        if not command:
            continue
        messages = ([{"role": "system", "content": system}] if system else []) + history
        messages.append({"role": "user", "content": query})
        print(">>> ", end="", flush=True)
        try:
            request, turn = fit_to_context(engine, InferRequest(messages=messages, adapter=adapter), config,
                                           a.max_new_tokens)
            if a.stream:
                async def run() -> str:
                    parts = []
                    async for delta in engine.stream_async(request, turn):
                        print(delta.text, end="", flush=True)
                        parts.append(delta.text)
                    return "".join(parts)

                answer = asyncio.run(run())
            else:
                answer = engine.infer([request], turn)[0].choices[0].text
                print(answer, end="")
        except Exception as e:  # noqa: BLE001 - this turn failed; the conversation goes on without it
            print(f"\nerror: {e if isinstance(e, SwiftError) else f'{type(e).__name__}: {e}'}", flush=True)
            continue
        print(flush=True)
        history += [{"role": "user", "content": query}, {"role": "assistant", "content": answer}]
    return {"turns": len(history) // 2}


def fit_to_context(engine, request, config, max_new_tokens: int | None):
    """With --max_new_tokens unset (ms-swift's default), an answer may use the rest of the
    model's context after the prompt; the request travels as token ids, encoded once."""
    from dataclasses import replace

    from swift.infer.protocol import InferRequest

    if max_new_tokens is not None:
        return request, config
    prompt = engine.encode(request)
    fitted = InferRequest(input_ids=prompt, adapter=request.adapter)
    return fitted, replace(config, max_tokens=max(engine.max_model_len - len(prompt), 1))


def infer_main(args: InferArguments | list[str] | None = None) -> dict[str, Any]:
    from swift.infer.factory import build_engine

    a = resolve_args(InferArguments, args, "swift infer")
    engine, adapters = build_engine(a)
    try:
        if a.val_dataset:
            return batch_infer(a, engine, _adapter(adapters))
        return interactive(a, engine, _adapter(adapters))
    finally:
        engine.close()

"""The benchmarks `swift eval` knows: how each loads (hub id or local file), what its prompt is, where
its gold answer lives and how an answer is scored.

- gsm8k (gold: after `#### `), math500 (`answer`), cmath (`golden`): math answers, compared with
  math-verify (the last `\\boxed{}` or number of the response, or its `<answer>`).
- arith: the built-in arithmetic eval split (`builtin:arith-sft:eval`), compared like math.
- general_qa (jsonl: query, response[, system, history]): exact match after trimming whitespace.
- general_mcq (csv: question, A, B, C, D, answer): the option letter of the response's last
  `ANSWER: X` line, else its last 'answer is X', else a letter opening its last line.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from swift.utils.registry import SwiftError

MATH_PROMPT = "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
MCQ_PROMPT = ("Answer the following multiple choice question. The last line of your answer should be "
              "'ANSWER: $LETTER' (without quotes), where LETTER is one of {letters}.\n\n{question}\n\n{options}")


@dataclass
class Question:
    id: str
    messages: list[dict]
    gold: str
    origin: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Benchmark:
    name: str
    kind: str  # math | qa | mcq
    hub: tuple[str, str] | None  # (ModelScope id, HF id)
    subset: str | None
    split: str
    convert: Callable[[dict], tuple[str, str]]  # row → (question text, gold)
    prompt: str = "{question}"
    file_types: tuple[str, ...] = (".jsonl", ".json", ".parquet", ".csv")


def _gsm8k(row: dict) -> tuple[str, str]:
    answer = str(row["answer"])
    if "####" not in answer:
        raise ValueError("'answer' has no '#### <number>' line")
    return row["question"], answer.split("####")[-1].strip().replace(",", "")


def _math500(row: dict) -> tuple[str, str]:
    return row["problem"], str(row["answer"])


def _cmath(row: dict) -> tuple[str, str]:
    return row["question"] if "question" in row else row["input"], str(row["golden"])  # XiaoMi's files: input


def _qa(row: dict) -> tuple[str, str]:  # EvalScope's general_qa also names them question / answer
    question = row.get("query", row.get("question"))
    answer = row.get("response", row.get("answer"))
    if question is None or answer is None:
        raise ValueError("general_qa rows need 'query' (or 'question') and 'response' (or 'answer')")
    return question, str(answer)


def _arith(row: dict) -> tuple[str, str]:  # messages rows: the first user turn, the last assistant turn
    user = next((m["content"] for m in row["messages"] if m["role"] == "user"), None)
    gold = next((m["content"] for m in reversed(row["messages"]) if m["role"] == "assistant"), None)
    if user is None or gold is None:
        raise ValueError("'messages' needs a user turn and an assistant turn (the gold answer)")
    return user, gold


def _mcq(row: dict) -> tuple[str, str]:
    letters = _letters(row)
    if len(letters) < 2:
        raise ValueError("needs option columns A, B, ...")
    gold = str(row["answer"]).strip().upper()
    if gold not in letters:
        raise ValueError(f"'answer' {row['answer']!r} is not one of the options {', '.join(letters)}")
    options = "\n".join(f"{k}) {row[k]}" for k in letters)
    return MCQ_PROMPT.format(letters=", ".join(letters), question=row["question"], options=options), gold


def _letters(row: dict) -> list[str]:
    return [k for k in OPTION_LETTERS if row.get(k) not in (None, "")]


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in [
    Benchmark("gsm8k", "math", ("AI-ModelScope/gsm8k", "openai/gsm8k"), "main", "test", _gsm8k, MATH_PROMPT),
    Benchmark("math500", "math", ("AI-ModelScope/MATH-500", "HuggingFaceH4/MATH-500"), None, "test", _math500,
              MATH_PROMPT),
    Benchmark("cmath", "math", ("evalscope/cmath", "weitianwen/cmath"), None, "test", _cmath, MATH_PROMPT),
    Benchmark("arith", "math", None, None, "eval", _arith),
    Benchmark("general_qa", "qa", None, None, "test", _qa),
    Benchmark("general_mcq", "mcq", None, None, "val", _mcq),
]}
ALIASES = {"math_500": "math500"}


def benchmark(name: str) -> Benchmark:
    b = BENCHMARKS.get(ALIASES.get(name, name))
    if b is None:
        raise SwiftError(f"--eval_dataset {name}: not a known benchmark ({', '.join(BENCHMARKS)}) nor a file")
    return b


def _local_files(bench: Benchmark, path: str, subsets: list[str] | None) -> list[str]:
    """A file, or a directory: ms-swift/EvalScope's `<subset>.jsonl` (general_qa) or
    `<subset>_val.csv` (general_mcq) per subset, else every data file whose name holds the split."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise SwiftError(f"--eval_dataset_args: {bench.name} local_path {path}: no such file or directory")
    files = sorted(str(p) for p in Path(path).rglob("*") if p.suffix.lower() in bench.file_types)
    if subsets:
        chosen = [f for s in subsets for f in files if Path(f).stem in (s, f"{s}_{bench.split}")]
        missing = [s for s in subsets if not any(Path(f).stem in (s, f"{s}_{bench.split}") for f in chosen)]
        if missing:
            raise SwiftError(f"--eval_dataset_args: {bench.name} subset {missing[0]!r} has no file "
                             f"{missing[0]}{'_' + bench.split if bench.split else ''}.* in {path}")
        return chosen
    split = [f for f in files if bench.split and bench.split in Path(f).name]
    if not (split or files):
        raise SwiftError(f"--eval_dataset_args: {bench.name} local_path {path} holds no data files")
    return split or files


def _hub_files(bench: Benchmark, use_hf: bool) -> list[str]:
    from swift.model.hub import snapshot_download

    repo = bench.hub[1] if use_hf else bench.hub[0]
    root = snapshot_download(repo, use_hf=use_hf, repo_type="dataset")
    files = sorted(str(p) for p in Path(root).rglob("*") if p.suffix.lower() in bench.file_types
                   and ".git" not in p.parts)
    if bench.subset:
        files = [f for f in files if bench.subset in Path(f).relative_to(root).parts] or files
    split = [f for f in files if bench.split in Path(f).name]
    if not split:
        raise SwiftError(f"benchmark {bench.name}: hub dataset {repo} has no {bench.split} file")
    return split


def load_questions(name: str, *, args: dict | None = None, use_hf: bool = False, limit: int | None = None,
                   strict: bool = False) -> tuple[Benchmark, list[Question], list[str]]:
    """The benchmark's questions (at most `limit`, from the start), and one line per dropped row.
    `name` is a known benchmark or a local file (its format guessed: general_mcq for csv with option
    columns, else general_qa, or messages rows like the built-in eval split)."""
    from swift.dataset.loader import DatasetSpec, iter_file, iter_raw
    from swift.template.base import RowError

    args = dict(args or {})
    unknown = set(args) - {"local_path", "subset_list", "few_shot_num", "prompt_template", "few_shot_random"}
    if unknown:
        raise SwiftError(f"--eval_dataset_args {name}: unknown key {sorted(unknown)[0]!r} (known: local_path, "
                         "subset_list, few_shot_num, prompt_template)")
    if int(args.get("few_shot_num") or 0):
        raise SwiftError(f"--eval_dataset_args {name}: few_shot_num > 0 is not supported; prompts are zero-shot "
                         "(set prompt_template to change them)")
    if os.path.exists(name) and name not in BENCHMARKS:
        args.setdefault("local_path", name)
        bench = _guess(name)
    else:
        bench = benchmark(name)
    if args.get("subset_list") and not os.path.isdir(args.get("local_path") or ""):
        raise SwiftError(f"--eval_dataset_args {name}: subset_list picks the files of a local_path directory "
                         "(<subset>.jsonl, <subset>_val.csv); without one it would change nothing")
    if bench.name == "arith" and "local_path" not in args:
        raw = iter_raw(DatasetSpec.parse("builtin:arith-sft:eval"))
    else:
        if "local_path" in args:
            files = _local_files(bench, args["local_path"], args.get("subset_list"))
        elif bench.hub is None:
            raise SwiftError(f"--eval_dataset {bench.name} needs a file: --eval_dataset PATH or --eval_dataset_args "
                             f"'{{\"{bench.name}\": {{\"local_path\": \"...\"}}}}'")
        else:
            files = _hub_files(bench, use_hf)
        raw = ((f"{path} row {i}", row) for path in files for i, row in iter_file(path))
    prompt = args.get("prompt_template") or bench.prompt
    if "{question}" not in prompt:
        raise SwiftError(f"--eval_dataset_args {name}: prompt_template must contain {{question}}")
    questions, dropped = [], []
    for origin, row in raw:
        if limit is not None and len(questions) >= limit:
            break
        try:
            if isinstance(row, RowError):
                raise row
            if not isinstance(row, dict):
                raise ValueError(f"row is {type(row).__name__}, expected an object")
            text, gold = bench.convert(row)
            messages = _history(row) + [{"role": "user", "content": prompt.replace("{question}", str(text))}]
            if row.get("system"):
                messages.insert(0, {"role": "system", "content": str(row["system"])})
        except (KeyError, ValueError, TypeError, RowError) as e:
            line = f"{origin}: " + (f"missing column {e}" if isinstance(e, KeyError) else str(e))
            if strict:
                raise SwiftError(f"{line} (fix the row, or run with --strict false to drop bad rows)") from None
            dropped.append(line)
            continue
        extra = {"letters": "".join(_letters(row))} if bench.kind == "mcq" else {}
        questions.append(Question(id=f"{bench.name}/{len(questions)}", messages=messages, gold=gold, origin=origin,
                                  extra=extra))
    if not questions:
        raise SwiftError(f"--eval_dataset {name}: no usable rows" + (f" ({dropped[0]})" if dropped else ""))
    return bench, questions, dropped


def _history(row: dict) -> list[dict]:
    messages = []
    for turn in row.get("history") or []:  # general_qa: [[query, response], ...]
        if not isinstance(turn, (list, tuple)) or len(turn) != 2:
            raise ValueError(f"'history' turns are [query, response] pairs, got {turn!r}")
        messages += [{"role": "user", "content": str(turn[0])}, {"role": "assistant", "content": str(turn[1])}]
    return messages


def _guess(path: str) -> Benchmark:
    from swift.dataset.loader import iter_file

    first = next((row for _, row in iter_file(path)), None) if os.path.isfile(path) else None
    if isinstance(first, dict):
        if "A" in first and "B" in first and "answer" in first:
            return BENCHMARKS["general_mcq"]
        if "messages" in first:
            return BENCHMARKS["arith"]
    return BENCHMARKS["general_qa"]


# -- scoring -----------------------------------------------------------------------------------------
OPTION_LETTERS = "ABCDEFGHIJ"
# in order of trust: the asked-for 'ANSWER: X' line, 'the answer is X', then an option letter
# alone at the start of the last line ('B', '(B)', 'B) Mercury', 'B.'); markdown bold around the
# letter or the keyword is allowed. A lower-case letter counts only after 'ANSWER:' and alone
# ('answer: a good guess' is words, 'ANSWER: d' an answer).
EXPLICIT = re.compile(r"(?i:answer|答案)\**\s*[:：]\s*[*(\s]*(?:([A-J])\b|([a-j])(?=[*)]*\.?\s*$))", re.MULTILINE)
STATED = re.compile(r"(?i:answer is)\s*:?\s*[*(\s]*([A-J])\b")
LEADING = re.compile(r"^[*(\s]*([A-J])(?:[).:]|[*)]*\s*$)")


def _mcq_letter(response: str, letters: str) -> str:
    for pattern in (EXPLICIT, STATED):
        found = [g.upper() for m in pattern.finditer(response) for g in m.groups() if g and g.upper() in letters]
        if found:
            return found[-1]
    lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
    match = LEADING.match(lines[-1]) if lines else None
    return match.group(1) if match and match.group(1) in letters else ""


def extract(kind: str, response: str, letters: str = OPTION_LETTERS) -> str:
    """The answer `score` compares: for math the last boxed value / number (math-verify), for MCQ
    the option letter (one of `letters`, the question's options), for QA the trimmed response."""
    if kind == "mcq":
        return _mcq_letter(response, letters)
    if kind == "math":
        from math_verify import parse

        try:
            parsed = parse(response)
        except Exception:
            return ""
        return str(parsed[-1]) if parsed else ""
    return response.strip()


def score(kind: str, response: str, gold: str, letters: str = OPTION_LETTERS) -> float:
    if kind == "math":
        from swift.rewards.builtin import is_correct

        # a LaTeX gold answer (MATH's `answer`) is parsed as math only between $ signs
        return is_correct(response, gold if re.fullmatch(r"-?[\d.,/]+", gold.strip()) else f"${gold}$")
    if kind == "mcq":
        return float(extract(kind, response, letters) == gold.strip().upper())
    return float(" ".join(response.split()) == " ".join(gold.split()))

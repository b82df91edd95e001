"""`swift eval`: each benchmark format's gold answers and scoring against hand-labelled cases, pass@k
on a fixed sample set, the whole command on the quickstart model (report, per-sample jsonl, PNG),
the same numbers through `--eval_url` against a real `swift deploy` process, and one-line errors."""
import json
import os
import subprocess

import pytest

from swift.eval.benchmarks import extract, load_questions, score
from swift.eval.metrics import pass_at_k, summarize
from swift.utils.registry import SwiftError

from tests.conftest import SWIFT

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "eval")


def local(name: str, path: str, **extra) -> tuple:
    return load_questions(name, args={"local_path": os.path.join(DATA, path), **extra})


def test_gold_answers_of_each_format():
    bench, qs, dropped = local("gsm8k", "gsm8k")
    assert bench.kind == "math" and [q.gold for q in qs] == ["72", "10", "1200"]  # after '#### ', commas out
    assert len(dropped) == 1 and "row 4" in dropped[0] and "####" in dropped[0]
    assert qs[0].messages[-1]["content"].startswith("Natalia sold clips") and "\\boxed{}" in qs[0].messages[-1]["content"]
    _, qs, _ = local("math500", "math500")
    assert [q.gold for q in qs] == ["\\left( 3, \\frac{\\pi}{2} \\right)", "\\frac{5}{6}"]
    _, qs, _ = local("cmath", "cmath")
    assert [q.gold for q in qs] == ["8", "60"]
    bench, qs, dropped = local("general_qa", "qa", subset_list=["example"])
    assert bench.kind == "qa" and [q.gold for q in qs] == ["Paris", "Rome"]
    assert qs[1].messages == [{"role": "system", "content": "Answer in one word."},
                              {"role": "user", "content": "What is the capital of Spain?"},
                              {"role": "assistant", "content": "Madrid"}, {"role": "user", "content": "And of Italy?"}]
    assert len(dropped) == 1 and "need 'query' (or 'question') and 'response'" in dropped[0]
    bench, qs, _ = local("general_mcq", "mcq", subset_list=["example"])
    assert bench.kind == "mcq" and [q.gold for q in qs] == ["B", "B", "C"]
    assert "A) Venus\nB) Mercury\nC) Earth\nD) Mars" in qs[0].messages[-1]["content"]
    # a file given as --eval_dataset: its format guessed from the columns; --eval_limit takes the first N
    bench, qs, _ = load_questions(os.path.join(DATA, "mcq", "example_val.csv"), limit=2)
    assert bench.name == "general_mcq" and len(qs) == 2
    with pytest.raises(SwiftError, match=r"row 4: 'answer' has no '#### <number>' line \(fix the row"):
        local("gsm8k", "gsm8k") and load_questions("gsm8k", args={"local_path": os.path.join(DATA, "gsm8k")},
                                                   strict=True)


SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "..", "shared",
                      "data")


@pytest.mark.parametrize("name,file,rows", [("gsm8k", "gsm8k_test.jsonl", 1319), ("math500", "math500_test.jsonl", 500),
                                            ("cmath", "cmath_dev.jsonl", 600)])
def test_the_real_benchmark_files_load_whole(name, file, rows):
    """The public GSM8K test split, MATH-500 and CMATH (the project's shared copies, where present):
    every row gives a question and a gold answer, and the gold answer scores as correct."""
    path = os.path.join(SHARED, file)
    if not os.path.exists(path):
        pytest.skip(f"{path} is not on this machine")
    bench, qs, dropped = load_questions(name, args={"local_path": path})
    assert len(qs) == rows and not dropped
    assert all(q.gold and q.messages[-1]["content"] for q in qs)
    for q in qs[:40]:
        assert score(bench.kind, f"The answer is \\boxed{{{q.gold}}}.", q.gold) == 1.0, q.gold


@pytest.mark.parametrize("kind,response,gold,expected", [
    ("math", "48 + 24 = 72, so the answer is \\boxed{72}.", "72", 1.0),
    ("math", "She earned $10.", "10", 1.0),  # the last number
    ("math", "First 5, then 7. Total: 12", "10", 0.0),
    ("math", "The sum is \\boxed{\\frac{10}{12}}", "\\frac{5}{6}", 1.0),  # equal values, different forms
    ("math", "\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
    ("math", "<answer>60</answer> pages (of 120)", "60", 1.0),
    ("math", "no number at all", "8", 0.0),
    ("qa", "  Paris \n", "Paris", 1.0),
    ("qa", "Paris, France", "Paris", 0.0),
    ("mcq", "The closest planet is Mercury.\nANSWER: B", "B", 1.0),
    ("mcq", "B) Mercury", "B", 1.0),
    ("mcq", "The answer is (C).", "B", 0.0),
    ("mcq", "I am not sure.", "B", 0.0),
    ("mcq", "I think the answer is B", "B", 1.0),  # not the 'I' opening the line
    ("mcq", "A is wrong and so is C.\nANSWER: D", "D", 1.0),  # not the letters opening earlier lines
    ("mcq", "ANSWER: A\nOn reflection, no.\nANSWER: C", "C", 1.0),  # the last answer line
    ("mcq", "(B)", "B", 1.0),
    ("mcq", "B.", "B", 1.0),
    ("mcq", "a) is my guess", "A", 0.0),  # a bare lower-case letter is a word, not an option
    ("mcq", "Mercury, I think.\nA tricky one though.", "A", 0.0),  # the word 'A' opening the last line
    ("mcq", "The answer: a good guess", "A", 0.0),
    ("mcq", "The answer is: B", "B", 1.0),
    ("mcq", "**Answer:** B", "B", 1.0),
    ("mcq", "ANSWER: **C**", "C", 1.0),
    ("mcq", "答案：B", "B", 1.0),
])
def test_scores_of_hand_labelled_answers(kind, response, gold, expected):
    assert score(kind, response, gold) == expected


def test_extracted_answers():
    assert extract("mcq", "ANSWER: d") == "D"
    assert extract("mcq", "ANSWER: E", letters="ABCD") == ""  # not one of the question's options
    assert extract("mcq", "E) maybe\nthe answer is C", letters="ABCDE") == "C"
    assert extract("math", "so \\boxed{72}") == "72"
    assert extract("qa", " Rome ") == "Rome"


def test_pass_at_k_on_a_fixed_sample_set():
    scores = [[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]]
    m = summarize(scores)
    # by hand: pass@1 = c/n; pass@2 = 1 - C(n-c,2)/C(4,2); pass@4 = any correct
    assert m["pass@1"] == pytest.approx((0.25 + 0 + 1 + 0.5) / 4)
    assert m["pass@2"] == pytest.approx(((1 - 3 / 6) + 0 + 1 + (1 - 1 / 6)) / 4)
    assert m["pass@4"] == pytest.approx(3 / 4)
    assert m["mean@4"] == pytest.approx(m["acc"]) == pytest.approx(7 / 16)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0
    assert summarize([[1], [0], [1]]) == {"acc": pytest.approx(2 / 3)}


def swift(*argv: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*SWIFT, *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=900)


def report_of(out_dir) -> tuple[dict, str]:
    (run,) = os.listdir(out_dir)
    path = os.path.join(out_dir, run)
    with open(os.path.join(path, "report.json")) as f:
        return json.load(f), path


def test_eval_of_the_quickstart_model_in_process_and_through_eval_url(tmp_path, quickstart):
    """Greedy answers on 60 held-out sums: the report, the per-sample file and the chart; the same
    answers and accuracy when `swift eval` talks to `swift deploy` over HTTP instead."""
    from tests.deploy.serving import deploy

    _, out = quickstart
    model = os.path.join(out, "sft")
    argv = ["--eval_dataset", "arith", "--eval_limit", "60", "--max_new_tokens", "8"]
    proc = swift("eval", "--model", model, *argv, "--eval_output_dir", str(tmp_path / "local"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report, path = report_of(tmp_path / "local")
    result = report["results"]["arith"]
    assert result["num_questions"] == 60 and result["acc"] >= 0.9, result
    assert "| arith   | 60" in proc.stdout and f"{result['acc']:.4f}" in proc.stdout
    assert os.path.getsize(os.path.join(path, "report.png")) > 1000
    with open(os.path.join(path, "arith.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 60 and all(r["scores"][0] == float(r["responses"][0] == r["gold"]) for r in rows)
    assert report["generation"]["temperature"] == 0.0 and report["config"]["eval_limit"] == 60
    with deploy("--model", model, "--served_model_name", "qs") as base:
        proc = swift("eval", "--eval_url", base + "/v1", *argv, "--eval_output_dir", str(tmp_path / "url"))
        # no length given: the server's default (the rest of the context), not a 1-token answer
        unbounded = swift("eval", "--eval_url", base + "/v1", *argv[:4], "--eval_output_dir", str(tmp_path / "url2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    remote, path = report_of(tmp_path / "url")
    with open(os.path.join(path, "arith.jsonl")) as f:
        remote_rows = [json.loads(line) for line in f]
    assert [r["responses"] for r in remote_rows] == [r["responses"] for r in rows]
    assert remote["results"]["arith"]["acc"] == result["acc"] and remote["eval_url"] == base + "/v1"
    assert unbounded.returncode == 0, unbounded.stderr[-3000:]
    assert report_of(tmp_path / "url2")[0]["results"]["arith"]["acc"] == result["acc"]


def test_pass_at_k_from_sampled_answers(tmp_path, quickstart):
    _, out = quickstart
    proc = swift("eval", "--model", os.path.join(out, "sft"), "--eval_dataset", "arith", "--eval_limit", "8",
                 "--eval_generation_config", '{"n": 4, "temperature": 1.0, "max_tokens": 8, "seed": 1}',
                 "--eval_output_dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report, path = report_of(tmp_path)
    result = report["results"]["arith"]
    assert result["num_samples"] == 4 and result["pass@1"] <= result["pass@2"] <= result["pass@4"]
    with open(os.path.join(path, "arith.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert all(len(r["responses"]) == 4 for r in rows)
    assert result["pass@4"] == pytest.approx(sum(max(r["scores"]) for r in rows) / 8)


@pytest.mark.parametrize("argv,message", [
    (["--eval_dataset", "mmlu_pro"], "--eval_dataset mmlu_pro: not a known benchmark (gsm8k, math500, cmath, arith, "
                                     "general_qa, general_mcq) nor a file"),
    (["--eval_dataset", "arith", "--eval_url", "http://127.0.0.1:9/v1"], "--eval_url http://127.0.0.1:9/v1: cannot "
                                                                         "reach the server"),
    (["--eval_dataset", "arith", "--eval_generation_config", "{n: 4}"], "--eval_generation_config: not valid JSON"),
    (["--eval_dataset", "arith", "--eval_generation_config", '{"beams": 4}'], "--eval_generation_config: unknown key 'beams'"),
    (["--eval_dataset", "general_qa"], "--eval_dataset general_qa needs a file"),
    (["--eval_dataset", "arith", "--eval_backend", "OpenCompass"], "--eval_backend OpenCompass is an ms-swift backend"),
    # flags nothing reads in this run
    (["--eval_dataset", "arith", "--eval_url", "http://127.0.0.1:9/v1", "--template", "qwen"],
     "--template does nothing with --eval_url: the server at http://127.0.0.1:9/v1 loads and runs the model"),
    (["--eval_dataset", "arith", "--eval_url", "http://127.0.0.1:9/v1", "--infer_backend", "vllm"],
     "--infer_backend does nothing with --eval_url"),
    (["--eval_dataset", "arith", "--eval_dataset_args", '{"arith": {"subset_list": ["main"]}}'],
     "--eval_dataset_args arith: subset_list picks the files of a local_path directory"),
])
def test_bad_input_stops_before_any_model_loads(tmp_path, argv, message):
    """Through eval_main, as the CLI calls it; nothing is written (no report directory)."""
    from swift.pipelines.eval import eval_main

    with pytest.raises(SwiftError) as e:
        eval_main(["--model", "builtin:tiny-chat", *argv, "--eval_output_dir", str(tmp_path / "out")])
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "out")


def test_an_output_dir_that_is_a_file_stops_before_any_model_loads(tmp_path):
    from swift.pipelines.eval import eval_main
    from swift.pipelines.sample import sample_main

    taken = tmp_path / "qa.jsonl"
    taken.write_text("kept\n")
    with pytest.raises(SwiftError, match="--eval_output_dir .*qa.jsonl: a file, not a directory"):
        eval_main(["--model", "builtin:tiny-chat", "--eval_dataset", "arith", "--eval_output_dir", str(taken)])
    with pytest.raises(SwiftError, match="--output_dir .*qa.jsonl: a file, not a directory"):
        sample_main(["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft:eval#2", "--output_dir",
                     str(taken)])
    assert taken.read_text() == "kept\n"


def test_the_cli_prints_one_line(tmp_path):
    proc = swift("eval", "--model", "builtin:tiny-chat", "--eval_dataset", "mmlu_pro")
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "not a known benchmark" in proc.stderr

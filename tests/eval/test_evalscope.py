"""`swift eval --eval_backend EvalScope` (where evalscope is installed: requirements/evalscope.txt): EvalScope scores our
model through a `swift deploy` the command starts, and through `--eval_url`; its accuracy on held-out
sums written in GSM8K's format equals the Native backend's on the same questions."""
import importlib.util
import json
import os

import pytest

from swift.utils.registry import SwiftError
from tests.eval.test_eval import report_of, swift

needs_evalscope = pytest.mark.skipif(importlib.util.find_spec("evalscope") is None,
                                     reason="evalscope is not installed (its own environment: docs/eval.md)")


def gsm8k_style_sums(directory, n: int = 24) -> str:
    """The first n held-out sums as GSM8K rows (`question`, `answer` ending in '#### <sum>') in
    EvalScope's local layout: <dir>/test.jsonl."""
    from swift.dataset.arith import arith_sft

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "test.jsonl"), "w") as f:
        for row in arith_sft("eval")[:n]:
            question, answer = row["messages"][0]["content"], row["messages"][1]["content"]
            f.write(json.dumps({"question": question, "answer": f"the sum is {answer}\n#### {answer}"}) + "\n")
    return str(directory)


@needs_evalscope
def test_evalscope_scores_like_native(tmp_path, quickstart):
    from tests.deploy.serving import deploy

    _, out = quickstart
    model = os.path.join(out, "sft")
    data = gsm8k_style_sums(tmp_path / "gsm8k")
    # the question as the prompt (the tiny model knows no instructions); zero-shot; the 'default' subset
    args = json.dumps({"gsm8k": {"local_path": data, "subset_list": ["default"], "few_shot_num": 0,
                                 "prompt_template": "{question}"}})
    native_args = json.dumps({"gsm8k": {"local_path": os.path.join(data, "test.jsonl"), "prompt_template": "{question}"}})
    common = ["--eval_dataset", "gsm8k", "--max_new_tokens", "8"]
    proc = swift("eval", "--model", model, *common, "--eval_backend", "EvalScope", "--eval_dataset_args", args,
                 "--eval_output_dir", str(tmp_path / "es"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report, path = report_of(tmp_path / "es")
    result = report["results"]["gsm8k"]
    assert report["backend"] == "evalscope" and result["backend"] == "evalscope"
    assert result["num_questions"] == 24 and result["metric"].startswith("acc") and "score" not in result
    assert os.path.exists(os.path.join(path, "evalscope", "reports"))
    proc = swift("eval", "--model", model, *common, "--eval_dataset_args", native_args,
                 "--eval_output_dir", str(tmp_path / "native"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    native = report_of(tmp_path / "native")[0]["results"]["gsm8k"]
    assert native["num_questions"] == 24 and native["acc"] >= 0.9
    assert result["acc"] == pytest.approx(native["acc"])
    with deploy("--model", model, "--served_model_name", "qs", "--api_key", "k3y") as base:
        proc = swift("eval", "--eval_url", base + "/v1", "--api_key", "k3y", "--model", "qs", *common,
                     "--eval_backend", "EvalScope", "--eval_dataset_args", args, "--eval_output_dir", str(tmp_path / "url"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report_of(tmp_path / "url")[0]["results"]["gsm8k"]["acc"] == pytest.approx(native["acc"])


def test_evalscope_refuses_what_it_cannot_score(tmp_path):
    """Before anything starts or is written: a benchmark EvalScope does not have (and, where evalscope
    is missing, the install line)."""
    from swift.pipelines.eval import eval_main

    with pytest.raises(SwiftError) as e:
        eval_main(["--model", "builtin:tiny-chat", "--eval_dataset", "arith", "--eval_backend", "EvalScope",
                   "--eval_output_dir", str(tmp_path / "out")])
    assert "--eval_dataset arith: --eval_backend EvalScope takes the benchmarks" in str(e.value)
    assert "\n" not in str(e.value) and not os.path.exists(tmp_path / "out")
    if importlib.util.find_spec("evalscope") is None:
        with pytest.raises(SwiftError, match=r"needs evalscope, in an environment of its own: pip install -r "
                                             r"requirements/evalscope.txt"):
            eval_main(["--model", "builtin:tiny-chat", "--eval_dataset", "gsm8k", "--eval_backend", "EvalScope",
                       "--eval_output_dir", str(tmp_path / "out")])
        assert not os.path.exists(tmp_path / "out")

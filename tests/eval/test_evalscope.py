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


FAKE_EVALSCOPE = '''
"""A stand-in for evalscope's API: records what swift hands it, asks the server one question, and
returns a report whose primary metric is acc 0.75 (or none)."""
import json, os, urllib.request


class TaskConfig:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class Metric:
    def __init__(self, name, score):
        self.name, self.score = name, score


class Report:
    def __init__(self, dataset_name, primary):
        self.dataset_name, self.primary_metric, self.num = dataset_name, primary, 3
        self.metrics = [Metric("bleu-1", 0.1)] + ([primary] if primary else [])


def run_task(task_cfg):
    body = {"model": task_cfg.model, "messages": [{"role": "user", "content": "07+45="}], "max_tokens": 4}
    request = urllib.request.Request(task_cfg.api_url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Authorization": "Bearer " + task_cfg.api_key,
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request) as r:
        answer = json.load(r)["choices"][0]["message"]["content"]
    children = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if "PPid:\\t%d\\n" % os.getpid() in open("/proc/%s/status" % pid).read():
                children.append(open("/proc/%s/cmdline" % pid).read().replace("\\0", " "))
        except OSError:
            pass
    record = {k: getattr(task_cfg, k) for k in ("model", "api_url", "datasets", "dataset_args", "limit",
                                                 "eval_batch_size", "generation_config", "work_dir")}
    record.update(answer=answer, children=children, key=task_cfg.api_key)
    json.dump(record, open(os.environ["FAKE_EVALSCOPE_RECORD"], "w"))
    primary = None if os.environ.get("FAKE_EVALSCOPE_NO_PRIMARY") else Metric("acc:mean", 0.75)
    return {name: Report(name, primary) for name in task_cfg.datasets}
'''


def test_the_started_server_and_what_evalscope_is_given(tmp_path):
    """Through the real command with a stand-in `evalscope` package (so this runs wherever the tests
    do): the adapter is asked for by its name, the one-off key is never on a command line, the server
    answers during the run and is gone after it, settings reach EvalScope, and a report without a
    primary metric stops in one line and leaves no run directory."""
    import socket

    from swift.pipelines.train import sft_main
    from tests.conftest import train_argv

    adapter = tmp_path / "adapter"
    sft_main(train_argv(adapter, "--learning_rate", "5e-2", "--max_steps", "2"))
    fake = tmp_path / "fake"
    (fake / "evalscope").mkdir(parents=True)
    (fake / "evalscope" / "__init__.py").write_text(FAKE_EVALSCOPE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]),
           "FAKE_EVALSCOPE_RECORD": str(tmp_path / "record.json")}
    argv = ["--model", "builtin:tiny-chat", "--adapters", f"arith={adapter}", "--eval_backend", "EvalScope",
            "--eval_dataset", "gsm8k", "math500", "--eval_limit", "3", "--eval_num_proc", "4",
            "--eval_dataset_args", '{"math500": {"local_path": "/data/math500"}}']
    proc = swift("eval", *argv, "--eval_output_dir", str(tmp_path / "out"), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.load(open(tmp_path / "record.json"))
    assert record["model"] == "arith" and isinstance(record["answer"], str)
    assert record["datasets"] == ["gsm8k", "math_500"] and record["dataset_args"] == {"math_500": {"local_path": "/data/math500"}}
    assert record["limit"] == 3 and record["eval_batch_size"] == 4 and record["generation_config"]["temperature"] == 0.0
    deploys = [c for c in record["children"] if " deploy " in c]
    assert len(deploys) == 1 and record["key"] not in deploys[0]
    report, path = report_of(tmp_path / "out")
    assert report["results"]["gsm8k"] == {"benchmark": "gsm8k", "backend": "evalscope", "num_questions": 3,
                                          "metric": "acc:mean", "metrics": {"bleu-1": 0.1, "acc:mean": 0.75},
                                          "acc": 0.75}
    assert record["work_dir"] == os.path.join(path, "evalscope")
    port = int(record["api_url"].split(":")[-1].split("/")[0])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    proc = swift("eval", *argv, "--eval_output_dir", str(tmp_path / "none"), env={**env, "FAKE_EVALSCOPE_NO_PRIMARY": "1"})
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
    assert "EvalScope named no primary metric" in proc.stderr and not os.listdir(tmp_path / "none")

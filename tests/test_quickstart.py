"""Learning check: examples/quickstart.sh (pt then sft on built-in arithmetic) must teach the tiny
model two-digit addition: exact match on the held-out split goes from ~0 to at least 60%."""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_untrained_model_scores_about_zero():
    from swift.dataset.loader import load_rows
    from swift.model import load_model
    from swift.template import get_template
    from swift.trainers.generate_eval import exact_match_accuracy

    model, tokenizer, _ = load_model("builtin:tiny-chat")
    rows = load_rows(["builtin:arith-sft:eval#100"]).rows
    assert exact_match_accuracy(model, get_template("chatml", tokenizer), rows, max_new_tokens=8) < 0.05


@pytest.mark.slow
def test_quickstart_learns_addition(tmp_path):
    proc = subprocess.run(["bash", os.path.join(ROOT, "examples", "quickstart.sh")], cwd=tmp_path,
                          env={**os.environ, "OUT": str(tmp_path / "qs")}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("eval accuracy: ")
    accuracy = float(last.split(": ")[1])
    metrics = json.load(open(tmp_path / "qs" / "sft" / "result.json"))["metrics"]
    assert accuracy == pytest.approx(metrics["eval_acc"], abs=1e-3)
    assert accuracy >= 0.6

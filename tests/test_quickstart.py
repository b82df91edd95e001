"""Learning check: examples/quickstart.sh (pt then sft on built-in arithmetic) must teach the tiny
model two-digit addition: exact match on the held-out split goes from ~0 to at least 85% (the median
bar that benchmarks/learning_robustness.py checks over seeds and CPU kernel settings, asserted here on
the default seed with this machine's kernels; tests/test_iterative_dpo.py is the suite's learning
check under an AVX2-only CPU's kernels)."""
import json
import os

import pytest


def test_untrained_model_scores_about_zero():
    from swift.dataset.loader import load_rows
    from swift.model import load_model
    from swift.template import get_template
    from swift.trainers.generate_eval import exact_match_accuracy

    model, tokenizer, _ = load_model("builtin:tiny-chat")
    rows = load_rows(["builtin:arith-sft:eval#100"]).rows
    assert exact_match_accuracy(model, get_template("chatml", tokenizer), rows, max_new_tokens=8) < 0.05


@pytest.mark.slow
def test_quickstart_learns_addition(quickstart):
    stdout, out = quickstart
    metrics = json.load(open(os.path.join(out, "sft", "result.json")))["metrics"]
    if stdout is not None:  # a fresh run: the script's last line reports the same figure
        last = stdout.strip().splitlines()[-1]
        assert last.startswith("eval accuracy: ")
        assert float(last.split(": ")[1]) == pytest.approx(metrics["eval_acc"], abs=1e-3)
    assert metrics["eval_acc"] >= 0.85

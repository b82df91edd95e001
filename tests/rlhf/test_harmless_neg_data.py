"""`--rlhf_type harmless`: a bad `--evaluate_on_neg_data` file is refused in one line before training
(never after it, with the trained model unsaved), the evaluation runs once the model is saved, a
resumed run's negdata.jsonl cut short by a crash is read back, and sampling flags a trained proposal
cannot honour are refused."""
import json
import os

import pytest

from swift.pipelines.rlhf import rlhf_main
from swift.trainers.harmless import HarmlessTrainer, NegData
from swift.utils.registry import SwiftError
from tests.rlhf.test_harmless import build, harmless_argv

GOOD = {"prompt": [], "completion": "x", "reward": 0.0, "prompt_ids": [5, 6, 7], "completion_ids": [8, 9],
        "loss_mask": [1, 1], "source": "policy", "step": 1}


def write(path, *lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def resolve(out, *argv):
    from swift.arguments.rlhf import RLHFArguments
    from swift.pipelines.base import resolve_args

    return resolve_args(RLHFArguments, harmless_argv(out, "--target_dist_beta", "-2", *argv), "swift rlhf")


@pytest.mark.parametrize("lines, message", [
    ((), "no samples"),
    ((json.dumps(GOOD), json.dumps({k: v for k, v in GOOD.items() if k != "completion_ids"})),
     "line 2: no completion_ids"),
    ((json.dumps(GOOD), "", '{"prompt_ids": [1'), "line 3: not JSON"),
    ((json.dumps({**GOOD, "loss_mask": [1]}),), "line 1: loss_mask must hold one 0 or 1 per completion token"),
    ((json.dumps({**GOOD, "prompt_ids": [1, "a"]}),), "line 1: prompt_ids must be a list of token ids"),
    (("[1, 2]",), "line 1: no prompt_ids, completion_ids, loss_mask"),
])
def test_a_bad_neg_data_file_is_refused_before_training(tmp_path, lines, message):
    path = write(tmp_path / "neg.jsonl", *lines)
    with pytest.raises(SwiftError, match=f"^--evaluate_on_neg_data {path}.*{message}") as e:
        resolve(tmp_path / "run", "--evaluate_on_neg_data", path)
    assert "\n" not in str(e.value)


def test_ids_outside_the_vocabulary_are_refused_when_the_trainer_is_built(tmp_path):
    path = write(tmp_path / "neg.jsonl", json.dumps(GOOD), json.dumps({**GOOD, "completion_ids": [8, 10 ** 6]}))
    with pytest.raises(SwiftError, match=r"line 2: completion_ids .* below the model's vocabulary size \d+"):
        build(tmp_path / "run", "--target_dist_beta", "-2", "--evaluate_on_neg_data", path)


def test_the_evaluation_runs_after_the_model_is_saved(tmp_path, monkeypatch):
    """Whatever goes wrong in the evaluation, the trained model is already on disk."""
    def broken(self, rows):
        assert os.path.exists(out / "model.safetensors")
        raise RuntimeError("evaluation failed")

    out = tmp_path / "run"
    monkeypatch.setattr(HarmlessTrainer, "evaluate_on_neg_data", broken)
    with pytest.raises(RuntimeError, match="evaluation failed"):
        rlhf_main(harmless_argv(out, "--tuner_type", "full", "--target_dist_beta", "-2", "--max_steps", "1",
                                "--evaluate_on_neg_data", write(tmp_path / "neg.jsonl", json.dumps(GOOD))))
    assert os.path.exists(out / "model.safetensors")


def test_a_resumed_runs_negdata_cut_short_by_a_crash_is_read_back(tmp_path):
    other = {**GOOD, "completion_ids": [8, 11]}
    path = tmp_path / "negdata.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(other) + "\n" + json.dumps(GOOD)[:20])
    neg = NegData(str(path), threshold=0.5)
    assert neg.seen == {((5, 6, 7), (8, 9)), ((5, 6, 7), (8, 11))}
    assert path.read_text() == json.dumps(GOOD) + "\n" + json.dumps(other) + "\n"  # the cut line is dropped
    write(path, json.dumps(GOOD), "not json", json.dumps(other))
    with pytest.raises(SwiftError, match=f"^--save_negdata: {path} line 2 is not a sample"):
        NegData(str(path), threshold=0.5)


def test_repetition_penalty_is_refused_with_a_trained_proposal(tmp_path):
    """The engine would sample q with the penalty while q's and pθ's log-probs (the importance weights,
    CTL) come from the unpenalised logits."""
    with pytest.raises(SwiftError, match="^--repetition_penalty with a proposal"):
        resolve(tmp_path, "--repetition_penalty", "1.2")
    resolve(tmp_path, "--repetition_penalty", "1.2", "--use_base_as_proposal")  # no proposal: pθ samples itself

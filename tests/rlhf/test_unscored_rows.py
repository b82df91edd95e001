"""Rows no reward function scored (NaN rewards): the advantage of a row left alone in its group, and
the completions file."""
import json
import math
from types import SimpleNamespace

import pytest
import torch

from swift.rlhf.grpo import compute_advantages

NAN = float("nan")


@pytest.mark.parametrize("estimator", ["rloo", "grpo", "dr_grpo", "reinforce_plus_plus", "reinforce_baseline"])
@pytest.mark.parametrize("scale", [None, "none", "group", "batch"])
def test_a_lone_scored_row_has_no_advantage(estimator, scale):
    """A group with one scored row has no baseline to compare it with: its advantage is 0 under every
    group estimator (before 2026-11-30 rloo gave it its raw reward), the unscored rows stay NaN (left
    out of the loss), and the other groups are untouched."""
    rewards = torch.tensor([1.0, NAN, NAN, NAN, 3.0, 1.0, 2.0, 2.0])
    adv = compute_advantages(rewards, 4, estimator, scale)
    assert adv[0].item() == 0.0 and adv[1:4].isnan().all()
    full = compute_advantages(rewards[4:], 4, estimator, scale)
    if scale != "batch" and not (scale is None and estimator == "reinforce_plus_plus"):  # batch std: both groups
        torch.testing.assert_close(adv[4:], full)


def test_rloo_with_two_scored_rows_compares_them():
    adv = compute_advantages(torch.tensor([1.0, 0.0, NAN, NAN]), 4, "rloo")
    assert adv[:2].tolist() == [1.0, -1.0] and adv[2:].isnan().all()


def test_completions_file_is_json_with_null_for_unscored_rows(tmp_path):
    """NaN is not JSON: an unscored row's reward (and a function's NaN) is written as null (before
    2026-11-30: NaN, which strict JSON readers reject)."""
    from swift.trainers.rollout_metrics import write_completions

    path = tmp_path / "completions.jsonl"
    trajectories = [SimpleNamespace(text="a"), SimpleNamespace(text="b")]
    write_completions(str(path), 3, [{"messages": [{"role": "user", "content": "q"}]}], trajectories,
                      torch.tensor([NAN, 0.5]), torch.tensor([0.0, 0.0]), ["f", "g"], [[None, 0.5], [NAN, 1.0]], 2)

    def strict(constant):
        raise ValueError(f"not JSON: {constant}")

    rows = [json.loads(line, parse_constant=strict) for line in path.read_text().splitlines()]
    assert [(r["reward"], r["rewards/f"], r["rewards/g"]) for r in rows] == [(None, None, None), (0.5, 0.5, 1.0)]
    assert rows[0]["advantage"] == 0.0 and not math.isnan(rows[1]["reward"])


def test_dynamic_sample_samples_again_a_group_whose_scored_rows_agree():
    """A group of [1, None, 1, 1] teaches nothing either: it is sampled again (before 2026-11-30 its
    std was NaN, so only groups without an unscored row were)."""
    from types import SimpleNamespace

    from swift.trainers.rollout import Rollout

    again = []
    stub = SimpleNamespace(
        a=SimpleNamespace(dynamic_sample=True, max_resample_times=1), n=4,
        _trajectories=lambda prompts, *_: [f"{p}{i}" for p in prompts for i in range(4)],
        score=lambda prompts, trajectories, n: (torch.tensor([1.0, float("nan"), 1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
                                                             if len(prompts) == 2 else [1.0, 0.0, 0.0, 0.0]), [[]]),
        generate=lambda prompts, n: again.extend(prompts) or [f"{p}*{i}" for p in prompts for i in range(n)])
    trajectories, rewards, _ = Rollout._sample_and_score(stub, ["a", "b"], 0, None, 1)
    assert again == ["a"] and trajectories[:4] == ["a*0", "a*1", "a*2", "a*3"]
    assert rewards[:4].tolist() == [1.0, 0.0, 0.0, 0.0]

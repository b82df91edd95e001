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


def test_dynamic_sample_replaces_a_group_whose_scored_rows_agree_with_a_new_prompt():
    """A group of [1, None, 1, 1] teaches nothing either: it is replaced (before 2026-11-30 its std
    was NaN, so only groups without an unscored row were) by a new prompt's group, drawn from the
    training set as ms-swift and DAPO do (before 2026-12-07 the same prompt was sampled again)."""
    from types import SimpleNamespace

    from swift.trainers.rollout import Rollout

    again = []
    stub = SimpleNamespace(
        a=SimpleNamespace(dynamic_sample=True, max_resample_times=1), n=4,
        args=SimpleNamespace(seed=0, process_index=0),
        trainer=SimpleNamespace(train_dataset=["c"]),
        _trajectories=lambda prompts, *_: [f"{p}{i}" for p in prompts for i in range(4)],
        score=lambda prompts, trajectories, n: (torch.tensor([1.0, float("nan"), 1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
                                                             if len(prompts) == 2 else [1.0, 0.0, 0.0, 0.0]), [[]]),
        generate=lambda prompts, n: again.extend(prompts) or [f"{p}*{i}" for p in prompts for i in range(n)])
    stub.fresh_prompts = lambda k, uses, round_: Rollout.fresh_prompts(stub, k, uses, round_)
    prompts, trajectories, rewards, _ = Rollout._sample_and_score(stub, ["a", "b"], 0, None, 1)
    assert again == ["c"] and prompts == ["c", "b"] and trajectories[:4] == ["c*0", "c*1", "c*2", "c*3"]
    assert trajectories[4:] == ["b0", "b1", "b2", "b3"] and rewards[:4].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_dynamic_sample_draws_depend_on_the_batch_round_and_rank_only():
    """The replacement prompts are a function of --seed, the generation batch, the round and the
    rank: a resumed run draws the ones the uninterrupted run drew, and ranks draw different ones."""
    from types import SimpleNamespace

    from swift.trainers.rollout import Rollout

    def draw(rank, uses=8, round_=0):
        stub = SimpleNamespace(args=SimpleNamespace(seed=3, process_index=rank),
                               trainer=SimpleNamespace(train_dataset=list(range(1000))))
        return Rollout.fresh_prompts(stub, 6, uses, round_)

    assert draw(0) == draw(0) and len(set(draw(0))) == 6
    assert draw(0) != draw(1) and draw(0) != draw(0, uses=16) and draw(0) != draw(0, round_=1)


def test_reward_functions_get_every_rows_columns():
    """A batch that mixes datasets: a column reaches the reward functions whichever row comes first,
    None for the rows without it (before 2026-12-07 only the first row's columns were passed, so
    `solution` vanished from this batch and the function below failed)."""
    from collections import defaultdict
    from types import SimpleNamespace

    from swift.rewards.manager import RewardManager
    from swift.rollout.runner import Trajectory
    from swift.trainers.rollout import Rollout

    seen = {}

    def solution_or_none(completions, solution, test_cases, **kwargs):
        seen.update(solution=solution, test_cases=test_cases)
        return [None if s is None else float(c == s) for c, s in zip(completions, solution)]

    prompts = [{"messages": [{"role": "user", "content": "code"}], "columns": {"test_cases": "t"}},
               {"messages": [{"role": "user", "content": "1+1"}], "columns": {"solution": "2"}}]
    trajectories = [Trajectory([1], [2], [1], text, False, [], {}) for text in ("x", "2")]
    stub = SimpleNamespace(rewards=RewardManager([("f", solution_or_none)]),
                           trainer=SimpleNamespace(processing_class=SimpleNamespace(decode=lambda ids: "p"),
                                                   _metrics={"train": defaultdict(list)}, state=None))
    rewards, _ = Rollout.score(stub, prompts, trajectories, 1)
    assert seen == {"solution": [None, "2"], "test_cases": ["t", None]}
    assert rewards[0].isnan() and rewards[1].item() == 1.0

"""reasoning-gym tasks as datasets (`--dataset reasoning_gym:<task>`) and their scorers as a reward."""
import json

import pytest

from swift.dataset.loader import DatasetSpec, iter_raw
from swift.dataset.reasoning_gym import ReasoningGymScore
from swift.pipelines.rlhf import rlhf_main
from swift.utils.registry import SwiftError
from tests.conftest import train_argv

EASY = "reasoning_gym:basic_arithmetic?min_terms=2&max_terms=2&max_digits=2&operators=[+]&allow_parentheses=false"


def rows(spec):
    return [row for _, row in iter_raw(DatasetSpec.parse(spec))]


def test_rows_follow_the_configuration_and_the_splits_share_no_question():
    train, held_out = rows(EASY + "#300"), rows(EASY + ":eval#40")
    assert len(train) == 300 and len(held_out) == 40
    questions = [r["messages"][0]["content"] for r in train]
    assert len(set(questions)) == 300 and not set(questions) & {r["messages"][0]["content"] for r in held_out}
    for r in train + held_out:
        entry = json.loads(r["reasoning_gym_entry"])
        assert entry["metadata"]["num_terms"] == 2 and "+" in entry["question"] and "*" not in entry["question"]
        assert r["solution"] == entry["answer"] == str(eval(entry["metadata"]["expression"]))
    assert rows(EASY + "#300") == train  # the same rows on every run


def test_the_tasks_scorer_is_the_reward():
    train = rows("reasoning_gym:basic_arithmetic#4")
    entries = [r["reasoning_gym_entry"] for r in train]
    answers = [train[0]["solution"], f"<think>x</think><answer>{train[1]['solution']}</answer>", "no idea",
               f"<answer>{int(train[3]['solution']) + 1}</answer>"]
    assert ReasoningGymScore()(answers, reasoning_gym_entry=entries) == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("spec,message", [
    ("reasoning_gym:basic_arithmetc#4", "no task 'basic_arithmetc'. Did you mean 'basic_arithmetic'"),
    ("reasoning_gym:basic_arithmetic?operators=[]#4", "refused the configuration"),
    ("reasoning_gym:basic_arithmetic?max_terms#4", "'max_terms' is not key=value"),
    ("reasoning_gym:basic_arithmetic:test#4", "subset 'test' is not one of train, eval"),
    ("reasoning_gym:basic_arithmetic?min_terms=2&max_terms=2&max_digits=1&operators=[+]&allow_parentheses=false"
     "&allow_negation=false#500", "only .* distinct train questions"),
])
def test_bad_specs_are_refused_in_one_line(spec, message):
    with pytest.raises(SwiftError, match=message):
        rows(spec)


def test_a_grpo_run_scores_with_the_tasks_scorer(tmp_path):
    """The logged reward of every completion equals the task's scorer on it, recomputed here."""
    rlhf_main(train_argv(tmp_path, "--rlhf_type", "grpo", "--dataset", EASY + "#4", "--reward_funcs", "reasoning_gym",
                         "--num_generations", "2", "--per_device_train_batch_size", "4", "--max_completion_length",
                         "4", "--temperature", "1.0", "--max_steps", "1", "--log_completions", "true"))
    entries = {r["messages"][0]["content"]: r["reasoning_gym_entry"] for r in rows(EASY + "#4")}
    logged = [json.loads(line) for line in open(tmp_path / "completions.jsonl")]
    assert len(logged) == 4
    expected = ReasoningGymScore()([r["completion"] for r in logged],
                                   reasoning_gym_entry=[entries[r["prompt"][-1]["content"]] for r in logged])
    assert [r["rewards/reasoning_gym"] for r in logged] == expected

"""`swift rlhf --rlhf_type grpo` end to end on the built-in tiny model."""
import json
import logging
import subprocess
import sys
import textwrap

import pytest

from swift.pipelines.rlhf import rlhf_main
from swift.utils.registry import SwiftError
from tests.conftest import TEXT_LENGTH, train_argv

TRL_NAMES = ["reward", "reward_std", "rewards/accuracy/mean", "rewards/accuracy/std", "frac_reward_zero_std",
             "completions/mean_length", "completions/clipped_ratio", "entropy", "clip_ratio/low_mean",
             "clip_ratio/high_mean", "clip_ratio/region_mean"]


def grpo_argv(out, *extra):
    return train_argv(out, "--rlhf_type", "grpo", "--dataset", "builtin:arith-sft#32", "--reward_funcs", "accuracy",
                      "--num_generations", "4", "--per_device_train_batch_size", "8", "--max_completion_length", "4",
                      "--temperature", "1.0", "--learning_rate", "1e-3", *extra)


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_grpo_logs_trl_metrics_and_completions(tmp_path):
    result = rlhf_main(grpo_argv(tmp_path, "--max_steps", "3", "--log_completions", "true",
                                 "--reward_funcs", "accuracy", "format", "--reward_weights", "1.0", "0.5"))
    logs = [r for r in read(tmp_path / "logging.jsonl") if "loss" in r]
    assert len(logs) == 3 and result["global_step"] == 3
    for name in TRL_NAMES + ["kl", "rewards/format/mean"]:
        assert all(name in r for r in logs), name
    completions = read(tmp_path / "completions.jsonl")
    assert len(completions) == 3 * 8
    row = completions[0]
    assert row["reward"] == pytest.approx(row["rewards/accuracy"] + 0.5 * row["rewards/format"])
    groups = [completions[i:i + 4] for i in range(0, 8, 4)]
    for group in groups:  # grpo advantages sum to zero within a group
        assert sum(r["advantage"] for r in group) == pytest.approx(0.0, abs=1e-4)
        assert len({json.dumps(r["prompt"]) for r in group}) == 1


def test_num_iterations_reuses_each_rollout(tmp_path):
    rlhf_main(grpo_argv(tmp_path, "--max_steps", "4", "--num_iterations", "2", "--log_completions", "true",
                        "--beta", "0"))
    completions = read(tmp_path / "completions.jsonl")
    assert len(completions) == 2 * 8  # two rollouts, each trained on twice
    assert [r["step"] for r in completions[::8]] == [0, 2]


@pytest.mark.parametrize("extra", [
    ["--tuner_type", "full", "--loss_type", "dapo", "--importance_sampling_level", "sequence", "--epsilon_high", "0.28"],
    ["--loss_type", "dr_grpo", "--advantage_estimator", "rloo", "--top_entropy_quantile", "0.5", "--kl_estimator", "k1",
     "--kl_in_reward", "false"],
    ["--advantage_estimator", "rloo"],  # the KL in the reward (its default)
    ["--loss_type", "bnpo", "--advantage_estimator", "reinforce_plus_plus", "--dynamic_sample", "true",
     "--max_resample_times", "2", "--overlong_filter", "true", "--scale_rewards", "batch"],
])
def test_algorithm_options_train(tmp_path, extra):
    rlhf_main(grpo_argv(tmp_path, "--max_steps", "2", *extra))
    logs = [r for r in read(tmp_path / "logging.jsonl") if "loss" in r]
    assert len(logs) == 2 and all(r["loss"] == r["loss"] for r in logs)  # finite, not NaN


def test_beta_zero_loads_no_reference(tmp_path):
    from swift.arguments.rlhf import RLHFArguments
    from swift.pipelines.rlhf import RLHFPipeline
    from swift.pipelines.base import resolve_args

    for beta, has_ref in (("0", False), ("0.04", True)):
        pipe = RLHFPipeline(resolve_args(RLHFArguments, grpo_argv(tmp_path, "--tuner_type", "full", "--beta", beta),
                                         "swift rlhf"))
        model, *_ = pipe.load()
        assert (pipe.trainer_kwargs(model).get("ref_model") is not None) == has_ref


def test_multi_turn_gym_rollouts_train(tmp_path):
    rlhf_main(grpo_argv(tmp_path, "--max_steps", "2", "--multi_turn_scheduler", "gym", "--gym_env", "guess_number",
                        "--max_turns", "2", "--reward_funcs", "gym_reward", "--max_completion_length", "12"))
    logs = [r for r in read(tmp_path / "logging.jsonl") if "loss" in r]
    assert all(1 <= r["completions/mean_turns"] <= 2 for r in logs)


def test_trajectories_whose_environment_fails_get_no_reward_and_the_run_goes_on(tmp_path):
    """An environment that raises on some trajectories mid-rollout: those trajectories end there and
    get no reward (left out of the loss), the others train (before 2026-11-27 the exception ended
    the run after generation)."""
    import os

    plugin = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins", "failing_env.py")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("swift").addHandler(handler)
    try:
        rlhf_main(grpo_argv(tmp_path, "--max_steps", "2", "--multi_turn_scheduler", "fails_on_odd", "--max_turns", "2",
                            "--external_plugins", plugin, "--max_completion_length", "8"))
    finally:
        logging.getLogger("swift").removeHandler(handler)
    failed = [r.getMessage() for r in records if "ended with an environment error (KeyError)" in r.getMessage()]
    assert failed  # some rows of arith-sft#32 have an odd sum
    assert all("no reward" in m for m in failed)
    logs = [r for r in read(tmp_path / "logging.jsonl") if "loss" in r]
    assert len(logs) == 2 and all(r["loss"] == r["loss"] for r in logs)  # trained, no NaN loss


def test_a_run_whose_environment_fails_on_every_trajectory_stops(tmp_path):
    """Every row's solution is odd, so the environment fails on every trajectory: the run stops after
    three such generation batches with one line (before 2026-12-07 it trained on nothing to the end)."""
    import os

    plugin = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins", "failing_env.py")
    data = tmp_path / "odd.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"{i}+0="}], "solution": str(i)}) + "\n"
                            for i in range(1, 17, 2)))
    with pytest.raises(SwiftError, match=r"every trajectory of the last 3 generation batches ended with an "
                                         r"environment error \(KeyError;"):
        argv = grpo_argv(tmp_path / "out", "--max_steps", "4", "--multi_turn_scheduler", "fails_on_odd", "--max_turns",
                         "2", "--external_plugins", plugin, "--max_completion_length", "8")
        rlhf_main([str(data) if a == "builtin:arith-sft#32" else a for a in argv])


def test_rows_the_environment_cannot_start_from_are_dropped_and_reported(tmp_path):
    """`\\boxed{11}` is no integer for guess_number: the run crashed after generation with a raw
    ValueError. Now the row is refused when the data is read: dropped and reported, or with
    --strict one line naming the file and row."""
    data = tmp_path / "guess.jsonl"
    rows = [{"messages": [{"role": "user", "content": "Guess the number."}], "solution": str(10 + i)} for i in range(8)]
    rows.insert(2, {"messages": [{"role": "user", "content": "Guess the number."}], "solution": "\\boxed{11}"})
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--dataset", str(data), "--multi_turn_scheduler", "gym", "--gym_env", "guess_number", "--max_turns", "2",
            "--reward_funcs", "gym_reward", "--max_completion_length", "12", "--max_steps", "1"]
    with pytest.raises(SwiftError, match=r"guess.jsonl.*3.*environment GuessNumber cannot start from this row"):
        rlhf_main(grpo_argv(tmp_path / "strict", *argv, "--strict", "true"))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("swift").addHandler(handler)
    try:
        rlhf_main(grpo_argv(tmp_path / "lenient", *argv))
    finally:
        logging.getLogger("swift").removeHandler(handler)
    assert any("dropped 1 of 9 rows read" in r.getMessage() and "cannot start from this row" in r.getMessage()
               for r in records)
    assert [r for r in read(tmp_path / "lenient" / "logging.jsonl") if "loss" in r]


def test_batch_must_hold_whole_groups(tmp_path):
    with pytest.raises(SwiftError, match="multiple of --num_generations"):
        rlhf_main(grpo_argv(tmp_path, "--num_generations", "3"))


@pytest.mark.parametrize("rlhf_type", ["grpo", "ppo"])
def test_too_few_prompts_for_one_generation_batch_are_refused(tmp_path, rlhf_type):
    # 3 prompts; a generation batch of 8 completions / 4 per prompt × 2 micro-batches needs 4: this
    # trained 0 steps, saved the untrained model and wrote result.json as a success
    argv = grpo_argv(tmp_path, "--dataset", "builtin:arith-sft#3", "--steps_per_generation", "2")
    if rlhf_type == "ppo":
        argv = grpo_argv(tmp_path, "--rlhf_type", "ppo", "--dataset", "builtin:arith-sft#3", "--num_generations", "1",
                         "--per_device_train_batch_size", "2", "--num_mini_batches", "2")
    with pytest.raises(SwiftError, match=r"--dataset has 3 prompt\(s\); one generation batch needs 4"):
        rlhf_main(argv)
    assert not (tmp_path / "result.json").exists() and not (tmp_path / "model.safetensors").exists()


def test_a_failing_user_reward_stops_with_one_line(tmp_path):
    plugin = tmp_path / "bad_reward.py"
    plugin.write_text(textwrap.dedent("""
        from swift.rewards import ORM, orms

        class Fragile(ORM):
            def __call__(self, completions, solution, **kwargs):
                return [1.0 / (int(s) - 100) for s in solution]

        orms['fragile'] = Fragile
    """))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"{a}+0="}], "solution": str(a)})
                              for a in (1, 2, 3, 100)) + "\n")
    argv = [a for a in grpo_argv(tmp_path / "out", "--max_steps", "1") if a != "accuracy"]
    argv[argv.index("--reward_funcs") + 1:argv.index("--reward_funcs") + 1] = ["fragile"]
    argv[argv.index("builtin:arith-sft#32")] = str(rows)
    argv += ["--external_plugins", str(plugin), "--per_device_train_batch_size", "16"]
    proc = subprocess.run([sys.executable, "-m", "swift", "rlhf", *argv], capture_output=True, text=True)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert "reward function 'fragile' failed on row" in last and "solution='100'" in last
    assert "ZeroDivisionError" in last


def clip_logs(tmp_path, *extra):
    rlhf_main(grpo_argv(tmp_path, "--max_steps", "2", "--per_device_train_batch_size", "4", "--beta", "0",
                        "--epsilon", "0.001", *TEXT_LENGTH, "--max_completion_length", "6",
                        "--learning_rate", "3e-2", "--log_completions", "true", *extra))
    return [r for r in read(tmp_path / "logging.jsonl") if "loss" in r], read(tmp_path / "completions.jsonl")


def test_each_iteration_is_an_optimizer_step_of_its_own(tmp_path):
    """--num_iterations 2 with gradient accumulation 2: the generation batch (2 micro-batches) is
    trained on in step 1, then again in step 2 after the update, where the ratios leave 1."""
    logs, completions = clip_logs(tmp_path, "--num_iterations", "2", "--gradient_accumulation_steps", "2")
    assert len(completions) == 8 and {r["step"] for r in completions} == {0}  # one generation, 2 prompts × 4
    assert logs[0]["clip_ratio/region_mean"] == 0.0  # the policy that sampled them
    assert logs[1]["clip_ratio/region_mean"] > 0.0  # one update later


@pytest.mark.parametrize("flag", [["--steps_per_generation", "2"], ["--generation_batch_size", "8"]])
def test_a_generation_batch_can_span_optimizer_steps(tmp_path, flag):
    logs, completions = clip_logs(tmp_path, *flag)
    assert len(completions) == 8 and {r["step"] for r in completions} == {0}
    assert logs[0]["clip_ratio/region_mean"] == 0.0 and logs[1]["clip_ratio/region_mean"] > 0.0


def test_steps_per_generation_must_be_a_multiple_of_accumulation(tmp_path):
    with pytest.raises(SwiftError, match="--steps_per_generation"):
        rlhf_main(grpo_argv(tmp_path, "--steps_per_generation", "3", "--gradient_accumulation_steps", "2"))


@pytest.mark.parametrize("argv, message", [
    (["--loss_type", "dapo", "bnpo"], "--loss_type takes one loss for grpo"),
    (["--precompute_ref_log_probs", "true"], "--precompute_ref_log_probs does nothing for --rlhf_type grpo"),
    (["--loss_type", "cispo", "--epsilon_high", "0.28"], "--epsilon_high 0.28: with --loss_type cispo it caps"),
    (["--delta", "1.1"], r"--delta must be greater than 1 \+ --epsilon"),
    (["--loss_type", "sapo", "--delta", "2"], "--delta applies to the clipped losses"),
    (["--loss_type", "sapo", "--tau_neg", "0"], "--tau_pos and --tau_neg must be positive"),
])
def test_grpo_refuses_what_it_would_ignore(tmp_path, argv, message):
    with pytest.raises(SwiftError, match=message):
        rlhf_main(grpo_argv(tmp_path, *argv))


def test_rows_no_reward_function_scored_are_left_out(tmp_path):
    from swift.pipelines.base import resolve_args
    from swift.pipelines.rlhf import RLHFArguments, RLHFPipeline

    plugin = tmp_path / "sometimes.py"
    plugin.write_text(textwrap.dedent("""
        from swift.rewards import ORM, orms

        class Sometimes(ORM):  # no opinion on every second completion
            def __call__(self, completions, **kwargs):
                return [None if i % 2 else float(len(c)) for i, c in enumerate(completions)]

        orms['sometimes'] = Sometimes
    """))
    pipeline = RLHFPipeline(resolve_args(RLHFArguments, grpo_argv(
        tmp_path / "out", "--max_steps", "1", "--reward_funcs", "sometimes", "--external_plugins", str(plugin),
        "--max_completion_length", "6", "--log_completions", "true"), "swift rlhf"))
    pipeline.run()
    completions = read(tmp_path / "out" / "completions.jsonl")
    for g in range(2):
        group = completions[4 * g:4 * g + 4]
        scored = [r["reward"] for r in group[0::2]]
        assert all(r["reward"] is None and r["advantage"] == 0.0 for r in group[1::2])  # null, no advantage
        mean, std = sum(scored) / 2, abs(scored[0] - scored[1]) / 2 ** 0.5
        for r, value in zip(group[0::2], scored):  # the group's statistics are the scored rows' own
            assert r["advantage"] == pytest.approx((value - mean) / (std + 1e-4), abs=1e-4)
    mask = pipeline.trainer._buffer[0]["loss_mask"]
    assert mask[1::2].sum() == 0 and mask[0::2].sum() > 0


def test_a_resumed_run_matches_an_uninterrupted_one(tmp_path):
    """A run with --num_iterations 2 (a generation batch every two steps) saving every step, then
    runs resumed from its checkpoints (what a run killed right after saving them resumes from):
    from step 2, a generation boundary, the next rollout is sampled with the RNG states restored;
    from step 3, inside a generation batch, its rest comes from the checkpoint. Both end with the
    uninterrupted run's logged losses and rewards and its weights (atol 1e-6)."""
    import shutil

    import torch
    from safetensors.torch import load_file

    def argv(out, *extra):
        return grpo_argv(out, "--max_steps", "4", "--num_iterations", "2", "--tuner_type", "full", *TEXT_LENGTH,
                         "--save_strategy", "steps", "--save_steps", "1", *extra)

    rlhf_main(argv(tmp_path / "straight"))
    straight = {r["global_step"]: r for r in read(tmp_path / "straight" / "logging.jsonl") if "loss" in r}
    final = load_file(tmp_path / "straight" / "model.safetensors")
    for step in (2, 3):
        out = tmp_path / f"from{step}"
        shutil.copytree(tmp_path / "straight" / f"checkpoint-{step}", out / f"checkpoint-{step}")
        rlhf_main(argv(out, "--resume_from_checkpoint", str(out / f"checkpoint-{step}")))
        resumed = {r["global_step"]: r for r in read(out / "logging.jsonl") if "loss" in r}
        assert sorted(resumed) == list(range(step + 1, 5))
        for s, r in resumed.items():
            for key in ("loss", "reward", "clip_ratio/region_mean"):
                assert (key in r) == (key in straight[s]) and r.get(key) == pytest.approx(straight[s].get(key)), (s, key)
        weights = load_file(out / "model.safetensors")
        for name, tensor in final.items():
            torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-6, msg=name)


def test_problem_solution_rows_reach_the_accuracy_reward(tmp_path):
    """ms-swift's GRPO data shape, {problem, solution}: the solution column reaches `accuracy`."""
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{a}+{b}=", "solution": str(a + b)}) + "\n"
                            for a in range(4) for b in range(4)))
    rlhf_main(grpo_argv(tmp_path / "out", "--dataset", str(data), "--max_steps", "1"))
    logged = [row for row in read(tmp_path / "out" / "logging.jsonl") if "rewards/accuracy/mean" in row]
    assert logged and 0.0 <= logged[0]["rewards/accuracy/mean"] <= 1.0

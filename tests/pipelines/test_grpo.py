"""`swift rlhf --rlhf_type grpo` end to end on the built-in tiny model."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from swift.pipelines.rlhf import rlhf_main
from swift.utils.registry import SwiftError
from tests.conftest import train_argv

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
    ["--loss_type", "dr_grpo", "--advantage_estimator", "rloo", "--top_entropy_quantile", "0.5", "--kl_estimator", "k1"],
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


def test_batch_must_hold_whole_groups(tmp_path):
    with pytest.raises(SwiftError, match="multiple of --num_generations"):
        rlhf_main(grpo_argv(tmp_path, "--num_generations", "3"))


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

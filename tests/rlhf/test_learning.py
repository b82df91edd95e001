"""Learning checks on the synthetic preference rule `builtin:arith-dpo` (the true sum is preferred
to a wrong one), starting from the quickstart's sft model: DPO must reach at least 90% held-out
preference accuracy (its implicit reward ranks chosen above rejected), and a reward model at least
90% held-out pairwise accuracy."""
import os

import pytest

from swift.pipelines.rlhf import rlhf_main

pytestmark = pytest.mark.slow


def run(quickstart, out, *extra):
    _, qs = quickstart
    return rlhf_main(["--model", os.path.join(qs, "sft"), "--tuner_type", "full", "--dataset", "builtin:arith-dpo",
                      "--val_dataset", "builtin:arith-dpo:eval", "--per_device_train_batch_size", "32",
                      "--per_device_eval_batch_size", "64", "--learning_rate", "5e-4", "--logging_steps", "20",
                      "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
                      "--output_dir", str(out), *extra])


def test_dpo_reaches_90_percent_held_out_preference_accuracy(quickstart, tmp_path):
    result = run(quickstart, tmp_path, "--rlhf_type", "dpo", "--beta", "0.1", "--max_steps", "240",
                 "--eval_steps", "240")
    assert result["metrics"]["eval_rewards/accuracies"] >= 0.9


def test_reward_model_reaches_90_percent_held_out_pairwise_accuracy(quickstart, tmp_path):
    result = run(quickstart, tmp_path, "--rlhf_type", "rm", "--max_steps", "240", "--eval_steps", "240")
    assert result["metrics"]["eval_accuracy"] >= 0.9


def test_grpo_raises_eval_accuracy_by_10_points(quickstart, tmp_path):
    """GRPO with the accuracy reward on the built-in arithmetic prompts, from the quickstart's sft
    model: the held-out accuracy of sampled answers (as TRL evaluates: the training sampling settings,
    a fixed seed) rises by at least 10 points."""
    _, qs = quickstart
    rlhf_main(["--rlhf_type", "grpo", "--model", os.path.join(qs, "sft"), "--tuner_type", "lora",
               "--dataset", "builtin:arith-sft", "--val_dataset", "builtin:arith-sft:eval",
               "--reward_funcs", "accuracy", "--num_generations", "8", "--per_device_train_batch_size", "256",
               "--max_completion_length", "6", "--temperature", "1.2", "--beta", "0",
               "--learning_rate", "2e-3", "--warmup_ratio", "0.05", "--max_steps", "180",
               "--eval_on_start", "true", "--eval_steps", "180", "--logging_steps", "20", "--save_strategy", "no",
               "--report_to", "none", "--disable_tqdm", "true", "--output_dir", str(tmp_path)])
    import json

    with open(tmp_path / "logging.jsonl") as f:
        evals = [r["eval_rewards/accuracy/mean"] for r in map(json.loads, f) if "eval_rewards/accuracy/mean" in r]
    assert evals[-1] - evals[0] >= 0.10, evals

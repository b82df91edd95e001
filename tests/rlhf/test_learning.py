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

"""Learning checks of the later stages, starting from the quickstart's sft model: DPO must reach at
least 90% held-out preference accuracy on `builtin:arith-dpo` (its implicit reward ranks the true sum
above a wrong one), a reward model at least 90% held-out pairwise accuracy, and GRPO must raise
held-out accuracy by at least 10 points, and PPO (with the accuracy reward and a critic sharing the
policy's backbone, and with a reward model trained by `--rlhf_type rm` from the same sft model and a
separate critic) likewise.

The `*_figure` functions are the recipes; `benchmarks/learning_robustness.py` runs the same ones over
seeds and CPU kernel settings, and docs quote its min / median / max."""
import json
import os

import pytest

from swift.pipelines.rlhf import rlhf_main
from tests.built import built, key_of
from tests.conftest import build_cache, quickstart_key

pytestmark = pytest.mark.slow
DEFAULT_SEED = 42


def _preference(qs: str, out: str, seed: int, *extra: str, lr: str = "5e-4", steps: str = "240") -> dict:
    return rlhf_main(["--model", os.path.join(qs, "sft"), "--tuner_type", "full", "--dataset", "builtin:arith-dpo",
                      "--val_dataset", "builtin:arith-dpo:eval", "--per_device_train_batch_size", "32",
                      "--per_device_eval_batch_size", "64", "--learning_rate", lr, "--logging_steps", "20",
                      "--max_steps", steps, "--eval_steps", steps, "--seed", str(seed), "--data_seed", str(seed),
                      "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
                      "--output_dir", str(out), *extra])


def dpo_figure(qs: str, out: str, seed: int = DEFAULT_SEED) -> float:
    """Held-out preference accuracy after 240 full-tuning DPO steps."""
    return _preference(qs, out, seed, "--rlhf_type", "dpo", "--beta", "0.1")["metrics"]["eval_rewards/accuracies"]


def rm_figure(qs: str, out: str, seed: int = DEFAULT_SEED) -> float:
    return rm_run(qs, out, seed)["metrics"]["eval_accuracy"]


def rm_run(qs: str, out: str, seed: int = DEFAULT_SEED) -> dict:
    """The reward model's run (result dict; the figure is its held-out pairwise accuracy).
    Held-out pairwise accuracy of a reward model after 600 full-tuning steps (its value head
    starts from scratch on a model that already answers sums well; 240 steps at 5e-4 gave 0.81, and
    400 steps, 0.94 on one machine, gave 0.861 on another 2-core AMD EPYC on 2026-11-25, where 600
    steps gave 0.929 / 0.931 (seeds 42 / 1) and 0.941 (seed 42, AVX2 kernels))."""
    return _preference(qs, out, seed, "--rlhf_type", "rm", lr="1e-3", steps="600")


GRPO_ARGS = ["--rlhf_type", "grpo", "--tuner_type", "lora", "--reward_funcs", "accuracy",
             "--num_generations", "8", "--per_device_train_batch_size", "256", "--max_completion_length", "6",
             "--temperature", "2.5", "--beta", "0", "--learning_rate", "2e-3", "--warmup_ratio", "0.05",
             "--max_steps", "60", "--eval_on_start", "true", "--eval_steps", "60", "--logging_steps", "20",
             "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--add_version", "false"]


def grpo_figure(qs: str, out: str, seed: int = DEFAULT_SEED) -> float:
    """Gain in held-out accuracy of sampled answers (as TRL evaluates: the training sampling
    settings, a fixed seed) over 60 LoRA GRPO steps with the accuracy reward, sampling at
    temperature 2.5 (until 2026-11-26: 180 steps at 2.0, whose start of ~0.87 left little room; its
    worst run gained +0.108)."""
    rlhf_main(["--model", os.path.join(qs, "sft"), "--dataset", "builtin:arith-sft",
               "--val_dataset", "builtin:arith-sft:eval", "--seed", str(seed), "--data_seed", str(seed), "--output_dir", str(out), *GRPO_ARGS])
    with open(os.path.join(out, "logging.jsonl")) as f:
        evals = [r["eval_rewards/accuracy/mean"] for r in map(json.loads, f) if "eval_rewards/accuracy/mean" in r]
    return evals[-1] - evals[0]


PPO_ARGS = ["--rlhf_type", "ppo", "--tuner_type", "lora", "--per_device_train_batch_size", "128",
            "--num_ppo_epochs", "4", "--max_completion_length", "6", "--temperature", "2.5", "--learning_rate", "4e-3",
            "--max_steps", "60", "--eval_on_start", "true", "--eval_steps", "60", "--logging_steps", "10",
            "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--add_version", "false"]


def _ppo_gain(qs: str, out: str, seed: int, *rewards: str) -> float:
    rlhf_main(["--model", os.path.join(qs, "sft"), "--dataset", "builtin:arith-sft",
               "--val_dataset", "builtin:arith-sft:eval", "--seed", str(seed), "--data_seed", str(seed), "--output_dir", str(out), *rewards,
               *PPO_ARGS])
    with open(os.path.join(out, "logging.jsonl")) as f:
        evals = [r["eval_rewards/accuracy/mean"] for r in map(json.loads, f) if "eval_rewards/accuracy/mean" in r]
    return evals[-1] - evals[0]


def ppo_figure(qs: str, out: str, seed: int = DEFAULT_SEED) -> float:
    """Gain in held-out accuracy of answers sampled at temperature 2.5 over 60 LoRA PPO steps (15
    rollouts of 128 prompts, 4 passes each) with the accuracy reward; the critic starts from the
    sft model with a fresh value head."""
    return _ppo_gain(qs, out, seed, "--reward_funcs", "accuracy")


def ppo_shared_figure(qs: str, out: str, seed: int = DEFAULT_SEED) -> float:
    """`ppo_figure` with `--critic_backbone shared`: the value head sits on the policy's own LoRA-tuned
    last hidden state instead of a second model."""
    return _ppo_gain(qs, out, seed, "--reward_funcs", "accuracy", "--critic_backbone", "shared")


def ppo_rm_figure(qs: str, out: str, seed: int = DEFAULT_SEED, rm: str | None = None) -> float:
    """The same gain when the only reward is a reward model trained by `rm_figure`'s recipe from the
    same sft model (the accuracy function is computed with weight 0, for the held-out figure). A KL
    coefficient of 0.2 (0.05 gave +0.14 against +0.18 on seed 42): the reward model also rates some
    wrong sums highly, and a tighter leash keeps the policy from chasing them."""
    if rm is None:
        rm = _preference(qs, os.path.join(out, "rm"), seed, "--rlhf_type", "rm", lr="1e-3", steps="600")["model_dir"]
    return _ppo_gain(qs, os.path.join(out, "ppo"), seed, "--reward_funcs", "accuracy", "--reward_model", rm,
                     "--reward_weights", "0", "1", "--kl_coef", "0.2")


def test_dpo_reaches_90_percent_held_out_preference_accuracy(quickstart, tmp_path):
    assert dpo_figure(quickstart[1], tmp_path) >= 0.9


@pytest.fixture(scope="session")
def reward_model(quickstart, request, tmp_path_factory) -> dict:
    """rm_figure's run, shared by its check and the PPO-with-a-reward-model check: built once for
    all workers, and kept for later runs while its code, recipe and start are unchanged."""
    if os.environ.get("SWIFT_TEST_QUICKSTART"):  # another start than the one the key names: not kept
        return rm_run(quickstart[1], tmp_path_factory.mktemp("rm"))

    def build(out):
        result = rm_run(quickstart[1], out / "rm")
        (out / "result.json").write_text(json.dumps({"metrics": result["metrics"],
                                                      "model_dir": os.path.relpath(result["model_dir"], out)}))

    out = built(build_cache(request.config), "reward-model",
                key_of(quickstart_key(), files=("tests/rlhf/test_learning.py",)), build)
    result = json.loads((out / "result.json").read_text())
    return {**result, "model_dir": str(out / result["model_dir"])}


def test_reward_model_reaches_90_percent_held_out_pairwise_accuracy(reward_model):
    assert reward_model["metrics"]["eval_accuracy"] >= 0.9


def test_grpo_raises_eval_accuracy_by_10_points(quickstart, tmp_path):
    assert grpo_figure(quickstart[1], tmp_path) >= 0.10


def test_ppo_with_a_shared_critic_raises_eval_accuracy_by_10_points(quickstart, tmp_path):
    # the separate critic's check is the reward-model one below (`ppo_figure`, the same recipe with a
    # separate critic, held +0.39..+0.42 over seeds and kernels: docs/benchmarks.md)
    assert ppo_shared_figure(quickstart[1], tmp_path) >= 0.10


def test_ppo_with_a_trained_reward_model_raises_eval_accuracy_by_10_points(quickstart, reward_model, tmp_path):
    assert ppo_rm_figure(quickstart[1], tmp_path, rm=reward_model["model_dir"]) >= 0.10

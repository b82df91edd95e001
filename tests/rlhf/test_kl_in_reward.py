"""`--kl_in_reward` (ms-swift's default for rloo and reinforce_plus_plus): each completion's reward
less β × Σ_t (log π_old − log π_ref) over its tokens, before the advantages; the loss then has no KL
term. (Before 2026-11-30 the KL was always a loss term, and `--kl_in_reward` was refused.)"""
import pytest
import torch

from swift.arguments.rlhf import RLHFArguments
from swift.pipelines.base import resolve_args
from swift.pipelines.rlhf import RLHFPipeline
from swift.rlhf.grpo import compute_advantages
from swift.trainers.rollout import Rollout
from tests.conftest import save_perturbed, train_argv


def grpo(tmp_path, *extra):
    return resolve_args(RLHFArguments, train_argv(
        tmp_path / "out", "--rlhf_type", "grpo", "--dataset", "builtin:arith-sft#8", "--reward_funcs", "accuracy",
        "--num_generations", "4", "--per_device_train_batch_size", "8", "--max_completion_length", "5",
        "--temperature", "1.0", "--tuner_type", "full", "--max_steps", "1", *extra), "swift rlhf")


@pytest.mark.parametrize("estimator,default", [("rloo", True), ("reinforce_plus_plus", True), ("grpo", False)])
def test_the_default_follows_ms_swift(tmp_path, estimator, default):
    assert grpo(tmp_path, "--advantage_estimator", estimator).kl_in_reward is default


def test_without_a_kl_the_default_is_false_and_args_json_repeats_the_run(tmp_path):
    """--beta 0: nothing to subtract; the value args.json records parses again (`--config`)."""
    a = grpo(tmp_path, "--advantage_estimator", "rloo", "--beta", "0")
    assert a.kl_in_reward is False
    again = grpo(tmp_path, "--advantage_estimator", "rloo", "--beta", "0", "--kl_in_reward", str(a.kl_in_reward))
    assert again.kl_in_reward is False and again.beta == 0


def test_the_advantages_take_each_completions_kl_off_its_reward(tmp_path, tiny, monkeypatch):
    ref_dir = save_perturbed(tiny, tmp_path / "ref", scale=0.2)
    trainer = RLHFPipeline(grpo(tmp_path, "--advantage_estimator", "rloo", "--beta", "0.5", "--ref_model",
                                ref_dir)).build_trainer()
    seen, betas = {}, []
    original = Rollout.assign_advantages

    def capture(self, micro, rewards, trajectories, steps=None):
        seen.update(micro=micro, shaped=rewards.clone(), advantages=original(self, micro, rewards, trajectories, steps))
        return seen["advantages"]

    monkeypatch.setattr(Rollout, "assign_advantages", capture)
    original_objective = type(trainer)._policy_objective

    def objective(self, model, inputs, beta, with_hidden=False):
        betas.append(beta)
        return original_objective(self, model, inputs, beta, with_hidden)

    monkeypatch.setattr(type(trainer), "_policy_objective", objective)
    raw = {}
    original_call = Rollout.__call__

    def call(self, *args, **kwargs):
        batch = original_call(self, *args, **kwargs)
        raw["rewards"] = batch.rewards.clone()
        return batch

    monkeypatch.setattr(Rollout, "__call__", call)
    trainer.train()
    # the KL of each completion from plain forwards of the starting policy and the reference
    policy, ref = RLHFPipeline(grpo(tmp_path)).load()[0], trainer.ref_model
    kls = []
    for batch in seen["micro"]:
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        start, width = batch["prompt_ids"].size(1) - 1, batch["completion_ids"].size(1)
        with torch.no_grad():
            logps = [torch.log_softmax(m(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1)
                                         .clamp(min=0)).logits.float(), -1)[:, start:start + width]
                     .gather(-1, batch["completion_ids"][..., None])[..., 0] for m in (policy, ref)]
        kls.append(((logps[0] - logps[1]) * batch["loss_mask"].float()).sum(-1))
    kl = torch.cat(kls)
    assert kl.abs().max() > 0.1  # the reference differs: the test can tell the KL from none
    torch.testing.assert_close(seen["shaped"], raw["rewards"] - 0.5 * kl, rtol=1e-4, atol=1e-4)
    expected = compute_advantages(raw["rewards"] - 0.5 * kl, 4, "rloo", "none").nan_to_num(0.0)
    torch.testing.assert_close(seen["advantages"], expected, rtol=1e-4, atol=1e-4)
    assert betas and set(betas) == {0.0}  # no KL term in the loss


def test_refused_where_it_does_nothing(tmp_path):
    from swift.utils.registry import SwiftError

    with pytest.raises(SwiftError, match="^--kl_in_reward true does nothing with --beta 0"):
        grpo(tmp_path, "--kl_in_reward", "true", "--beta", "0")
    with pytest.raises(SwiftError, match="^--kl_estimator does nothing with --kl_in_reward true"):
        grpo(tmp_path, "--advantage_estimator", "rloo", "--kl_estimator", "k1")
    with pytest.raises(SwiftError, match="^--kl_in_reward"):
        resolve_args(RLHFArguments, train_argv(tmp_path, "--rlhf_type", "ppo", "--dataset", "builtin:arith-sft#8",
                                               "--reward_funcs", "accuracy", "--kl_in_reward", "true"), "swift rlhf")

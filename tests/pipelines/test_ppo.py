"""`swift rlhf --rlhf_type ppo` end to end on the built-in tiny model: TRL's metric names, the
critic saved and resumed, GAE and the value loss as the trainer computes them equal to the
formulas, and the flags it refuses."""
import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file

from swift.pipelines.rlhf import rlhf_main
from swift.trainers.ppo import PPORollout, PPOTrainer
from swift.utils.registry import SwiftError
from tests.conftest import TEXT_LENGTH, save_perturbed, train_argv

TRL_PPO_NAMES = ["objective/kl", "objective/entropy", "objective/non_score_reward", "objective/rlhf_reward",
                 "objective/scores", "policy/approxkl_avg", "policy/clipfrac_avg", "loss/policy_avg",
                 "loss/value_avg", "val/clipfrac_avg", "policy/entropy_avg", "val/ratio", "val/ratio_var",
                 "val/num_eos_tokens", "val/var_explained"]


def ppo_argv(out, *extra):
    return train_argv(out, "--rlhf_type", "ppo", "--dataset", "builtin:arith-sft#32", *TEXT_LENGTH,
                      "--per_device_train_batch_size", "8", "--max_completion_length", "6", "--temperature", "1.0",
                      "--learning_rate", "1e-3", *extra)


def caught_output_layer(monkeypatch, backbone: str) -> str:
    """"shared-caught": the shared critic on a model whose output layer is not a plain one, so its
    hidden states are caught on their way into that layer (the built-in model's is plain)."""
    if backbone == "shared-caught":
        monkeypatch.setattr("swift.rlhf.logps.PLAIN_HEAD_MODEL_TYPES", set())
        return "shared"
    return backbone


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("tuner,backbone", [("lora", "separate"), ("full", "separate"), ("lora", "shared")])
def test_ppo_trains_logs_trl_names_and_saves_its_critic(tmp_path, tuner, backbone):
    result = rlhf_main(ppo_argv(tmp_path, "--tuner_type", tuner, "--num_ppo_epochs", "2",
                                "--critic_backbone", backbone))
    logs = [r for r in read(tmp_path / "logging.jsonl") if "loss" in r]
    assert len(logs) == 4
    for name in TRL_PPO_NAMES:
        assert name in logs[0], name
    assert all(r["objective/kl_coef"] == 0.05 for r in logs if "objective/kl_coef" in r)
    assert logs[0]["val/ratio"] == pytest.approx(1.0)  # the first update starts at the sampling policy
    assert logs[1]["policy/approxkl_avg"] > 0  # the second pass trains a moved policy on the same rollout
    assert result["global_step"] == 4
    if backbone == "shared":  # a value head on the policy, saved on its own: no second model
        assert not (tmp_path / "critic").exists()
        assert set(load_file(tmp_path / "value_head.safetensors")) == {"weight", "bias"}
        return
    critic = tmp_path / "critic"
    assert (critic / ("adapter_model.safetensors" if tuner == "lora" else "model.safetensors")).exists()


def openrlhf_gae(rewards, values, mask, gamma, lam):
    """GAE as OpenRLHF's `get_advantages_and_returns` writes it (masked rewards and values, the
    value after the last token 0), independent of swift.rlhf.ppo.gae."""
    values, rewards = values * mask, rewards * mask
    advantages, last = [], 0.0
    for t in reversed(range(rewards.size(1))):
        next_values = values[:, t + 1] if t < rewards.size(1) - 1 else 0.0
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last = delta + gamma * lam * last
        advantages.append(last)
    advantages = torch.stack(advantages[::-1], dim=1)
    return advantages, advantages + values


@pytest.mark.parametrize("backbone", ["separate", "shared"])
def test_advantages_returns_and_value_loss_are_the_formulas(tmp_path, monkeypatch, backbone, tiny):
    """What the trainer computes on its own rollout: per-token rewards (score on the last token, −β k1
    KL on each, against a reference that differs from the policy so the KL is not 0), GAE (OpenRLHF's
    formula written out here), whitening over the batch's loss tokens, and the first step's value
    loss (the critic has not moved: ½ mean (V − R)²) and policy loss (ratio 1: −mean A)."""
    save_perturbed(tiny, tmp_path / "ref")
    seen = []
    original = PPORollout.assign_advantages

    def spy(self, micro, rewards, trajectories, steps=None):
        out = original(self, micro, rewards, trajectories, steps)
        seen.append(([dict(b) for b in micro], rewards.clone(), self.kl_ctl.value))
        return out

    monkeypatch.setattr(PPORollout, "assign_advantages", spy)
    rlhf_main(ppo_argv(tmp_path / "run", "--tuner_type", "full", "--max_steps", "1", "--num_ppo_epochs", "1",
                       "--kl_coef", "0.2", "--lam", "0.9", "--gamma", "0.95", "--critic_backbone", backbone,
                       "--ref_model", str(tmp_path / "ref")))
    (micro,), rewards, beta = seen[0]
    mask = micro["completion_mask"].float()
    kl = (micro["old_logps"] - micro["ref_logps"]) * mask * micro["loss_mask"]
    lengths = mask.sum(-1).long()
    token_reward = -0.2 * kl
    token_reward[torch.arange(len(lengths)), lengths - 1] += rewards
    adv, ret = openrlhf_gae(token_reward, micro["values"], mask, 0.95, 0.9)
    torch.testing.assert_close(micro["returns"], ret, rtol=1e-5, atol=1e-5)
    loss_mask = micro["loss_mask"].bool()
    picked = adv[loss_mask]
    whitened = (picked - picked.mean()) / (picked.var() + 1e-8).sqrt()
    torch.testing.assert_close(micro["advantages"][loss_mask], whitened, rtol=1e-4, atol=1e-4)
    assert (kl != 0).sum() > mask.sum() / 2  # the KL penalty is in the rewards
    log = next(r for r in read(tmp_path / "run" / "logging.jsonl") if "loss" in r)
    value = 0.5 * ((micro["values"] - micro["returns"])[loss_mask] ** 2).mean().item()
    assert log["loss/value_avg"] == pytest.approx(value, rel=1e-4, abs=1e-6)
    assert log["loss/policy_avg"] == pytest.approx(-micro["advantages"][loss_mask].mean().item(), abs=1e-5)
    assert log["loss"] == pytest.approx(log["loss/policy_avg"] + 0.1 * value, rel=1e-3, abs=1e-5)


@pytest.mark.parametrize("tuner,steps,backbone", [("full", (2, 3), "separate"), ("lora", (3,), "separate"),
                                                   ("lora", (3,), "shared")])
def test_a_resumed_run_matches_an_uninterrupted_one(tmp_path, tuner, steps, backbone):
    """Adaptive KL (its coefficient is part of the checkpoint), two passes per rollout: resumed
    inside a rollout (step 3) and at its boundary (step 2), the run ends with the uninterrupted run's
    losses, policy, critic and KL coefficient (a LoRA critic: its adapter and head; a shared one:
    the value head)."""
    def argv(out, *extra):
        return ppo_argv(out, "--tuner_type", tuner, "--max_steps", "4", "--num_ppo_epochs", "2",
                        "--kl_target", "0.01", "--kl_horizon", "50", "--save_strategy", "steps", "--save_steps", "1",
                        "--critic_backbone", backbone, *extra)

    rlhf_main(argv(tmp_path / "straight"))
    straight = {r["global_step"]: r for r in read(tmp_path / "straight" / "logging.jsonl") if "loss" in r}
    assert straight[3]["objective/kl_coef"] != 0.05  # the controller moved
    weights = "model.safetensors" if tuner == "full" else "adapter_model.safetensors"
    for step in steps:
        out = tmp_path / f"from{step}"
        shutil.copytree(tmp_path / "straight" / f"checkpoint-{step}", out / f"checkpoint-{step}")
        rlhf_main(argv(out, "--resume_from_checkpoint", str(out / f"checkpoint-{step}")))
        resumed = {r["global_step"]: r for r in read(out / "logging.jsonl") if "loss" in r}
        assert sorted(resumed) == list(range(step + 1, 5))
        for s, r in resumed.items():
            for key in ("loss", "loss/value_avg", "objective/kl_coef"):
                assert (key in r) == (key in straight[s]), (s, key)
                assert r.get(key) == pytest.approx(straight[s].get(key)), (s, key)
        for path in (weights, f"critic/{weights}" if backbone == "separate" else "value_head.safetensors"):
            final, resumed_weights = load_file(tmp_path / "straight" / path), load_file(out / path)
            for name, tensor in final.items():
                torch.testing.assert_close(resumed_weights[name], tensor, rtol=0, atol=1e-6, msg=f"{path} {name}")


def test_critic_from_a_reward_model_directory(tmp_path):
    """--critic_model: a seq_cls reward model's weights (its one-label head included) start the critic."""
    rm = tmp_path / "rm"
    rlhf_main(train_argv(rm, "--rlhf_type", "rm", "--dataset", "builtin:arith-dpo#8", "--tuner_type", "full",
                         "--max_steps", "1"))
    out = tmp_path / "ppo"
    rlhf_main(ppo_argv(out, "--tuner_type", "full", "--max_steps", "1", "--critic_model", str(rm),
                       "--critic_learning_rate", "0"))
    head = load_file(rm / "model.safetensors")["score.weight"]
    torch.testing.assert_close(load_file(out / "critic" / "model.safetensors")["score.weight"], head)


@pytest.mark.parametrize("argv,message", [
    (["--rlhf_type", "grpo", "--advantage_estimator", "gae"], "needs a learned critic"),
    (["--rlhf_type", "ppo", "--advantage_estimator", "rloo"], "estimates advantages with its critic"),
    (["--rlhf_type", "ppo", "--dynamic_sample", "true"], "--dynamic_sample"),
    (["--rlhf_type", "ppo", "--reward_clip_range", "1"], "--reward_clip_range takes LOW HIGH"),
    (["--rlhf_type", "ppo", "--kl_coef", "0.1", "--beta", "0.2"], "--kl_coef 0.1 and --beta 0.2"),
    (["--rlhf_type", "ppo", "--deepspeed", "zero2"], "not in this version yet"),
    (["--rlhf_type", "grpo", "--critic_model", "x"], "--critic_model does nothing for --rlhf_type grpo; it is read "
                                                     "by --rlhf_type ppo"),
    (["--rlhf_type", "ppo", "--critic_backbone", "shared", "--critic_model", "x"], "give one"),
    (["--rlhf_type", "ppo", "--critic_backbone", "policy"], "--critic_backbone must be separate or shared"),
    (["--rlhf_type", "ppo", "--remote_rm_url", "ftp://x"], "must be an http(s) URL or a .py file"),
    (["--rlhf_type", "grpo", "--algo.advantage.gamma", "0.9"], "--gamma does nothing for --rlhf_type grpo"),
    (["--rlhf_type", "ppo", "--kl_target", "1", "--beta", "0"], "--kl_target adapts the KL coefficient"),
    (["--rlhf_type", "ppo", "--fp16", "true"], "--fp16 with --rlhf_type ppo"),
    (["--rlhf_type", "ppo", "--epsilon", "0.2", "--cliprange", "0.3"], "--cliprange 0.3 and --epsilon 0.2"),
])
def test_ppo_refuses_what_it_would_ignore(tmp_path, argv, message):
    with pytest.raises(SwiftError, match=re.escape(message)):
        rlhf_main(train_argv(tmp_path, "--dataset", "builtin:arith-sft#8", *TEXT_LENGTH, *argv))


def test_aliases_are_written_once_so_args_json_repeats_the_run(tmp_path):
    """An alias is stored under our name only: `--config args.json` gives the same arguments again
    (no reward counted twice, no conflict between an alias and its target)."""
    from swift.arguments.base import to_jsonable
    from swift.arguments.parser import parse_args
    from swift.arguments.rlhf import RLHFArguments

    argv = ["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft#8", "--rlhf_type", "ppo",
            "--remote_rm_url", "r.py", "--kl_coef", "0.1", "--num_ppo_epochs", "2", "--cliprange", "0.3"]
    first = parse_args(RLHFArguments, argv)
    path = tmp_path / "args.json"
    path.write_text(json.dumps(to_jsonable(first.to_dict())))
    again = parse_args(RLHFArguments, ["--config", str(path)])
    for name in ("reward_funcs", "beta", "num_iterations", "epsilon", "remote_rm_url", "kl_coef"):
        assert getattr(again, name) == getattr(first, name), name
    assert again.reward_funcs == ["r.py"] and again.beta == 0.1
    assert parse_args(RLHFArguments, ["--config", str(path), "--beta", "0.3"]).beta == 0.3


def test_openrlhf_names_map_onto_ours():
    from swift.arguments.parser import parse_args
    from swift.arguments.rlhf import RLHFArguments

    base = ["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft#8"]
    a = parse_args(RLHFArguments, [*base, "--rlhf_type", "grpo", "--advantage_estimator", "group_norm",
                                   "--n_samples_per_prompt", "4", "--remote_rm_url", "http://127.0.0.1:9/",
                                   "--per_device_train_batch_size", "8"])
    assert (a.advantage_estimator, a.num_generations, a.reward_model_url) == ("grpo", 4, "http://127.0.0.1:9/")
    a = parse_args(RLHFArguments, [*base, "--rlhf_type", "grpo", "--advantage_estimator", "reinforce",
                                   "--remote_rm_url", "reward.py"])
    assert a.advantage_estimator == "reinforce" and a.reward_funcs == ["reward.py"]  # OpenRLHF's own estimator
    a = parse_args(RLHFArguments, [*base, "--rlhf_type", "grpo", "--algo.advantage.estimator", "rloo",
                                   "--rollout.n_samples_per_prompt=2", "--reward.remote_url", "r.py",
                                   "--algo.kl.init_coef", "0.01"])
    assert (a.advantage_estimator, a.num_generations, a.reward_funcs, a.beta) == ("rloo", 2, ["r.py"], 0.01)
    assert a.kl_in_reward  # OpenRLHF's rloo, as ms-swift's, subtracts the KL from the reward
    a = parse_args(RLHFArguments, [*base, "--rlhf_type", "ppo", "--init_kl_coef", "0.01", "--num_ppo_epochs", "2",
                                   "--cliprange", "0.1"])
    assert (a.beta, a.num_iterations, a.epsilon, a.num_generations, a.kl_estimator, a.loss_type) == \
        (0.01, 2, 0.1, 1, "k1", ["dapo"])


@pytest.mark.parametrize("backbone", ["separate", "shared", "shared-caught"])
def test_policy_and_critic_updates_do_not_depend_on_gradient_accumulation(tmp_path, monkeypatch, backbone):
    """One rollout of 8 prompts, trained as 1 micro-batch of 8 or 2 of 4 (one optimizer step, plain
    SGD at learning rate 1: the weight change is the accumulated gradient): the same loss, policy
    and critic. The critic's gradients are accumulated and clipped outside the HF loop, so this
    checks that code too; a shared critic's value loss also moves the policy's weights."""
    from tests.pipelines.test_grad_accum import one_step

    backbone = caught_output_layer(monkeypatch, backbone)
    extra = [*TEXT_LENGTH, "--max_completion_length", "6", "--temperature", "1.0", "--num_ppo_epochs", "1",
             "--max_grad_norm", "0.5", "--critic_backbone", backbone]
    loss1, policy1 = one_step(tmp_path / "ga1", "ppo", 8, 1, *extra)
    loss2, policy2 = one_step(tmp_path / "ga2", "ppo", 4, 2, *extra)
    assert loss2 == pytest.approx(loss1, rel=1e-4, abs=1e-5)
    for name in policy1:
        torch.testing.assert_close(policy2[name], policy1[name], rtol=1e-5, atol=1e-5, msg=name)
    saved = "critic/model.safetensors" if backbone == "separate" else "value_head.safetensors"
    critic1, critic2 = load_file(tmp_path / "ga1" / saved), load_file(tmp_path / "ga2" / saved)
    for name in critic1:
        torch.testing.assert_close(critic2[name], critic1[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("backbone", ["separate", "shared", "shared-caught"])
def test_only_a_shared_critics_value_loss_moves_the_policy(tmp_path, monkeypatch, backbone):
    """The same step with --vf_coef 0 and 1: a separate critic's value loss leaves the policy's
    weights as they were; a shared one's trains them through the value head."""
    from tests.pipelines.test_grad_accum import one_step

    backbone = caught_output_layer(monkeypatch, backbone)
    extra = [*TEXT_LENGTH, "--max_completion_length", "6", "--temperature", "1.0", "--num_ppo_epochs", "1",
             "--critic_backbone", backbone]
    _, without = one_step(tmp_path / "vf0", "ppo", 8, 1, *extra, "--vf_coef", "0")
    _, with_value = one_step(tmp_path / "vf1", "ppo", 8, 1, *extra, "--vf_coef", "1")
    moved = [name for name in without if not torch.equal(without[name], with_value[name])]
    assert bool(moved) == (backbone == "shared"), moved


def test_with_dropout_on_the_sampling_pass_runs_in_eval_mode(tmp_path, monkeypatch):
    """--disable_dropout false: the log-probs and values at sampling (and the reference's) are taken
    in eval mode, as the engine sampled without dropout; the update's forward trains with it."""
    modes = []
    original = PPOTrainer._token_logps

    def spy(self, model, batch, *args, **kwargs):
        modes.append(("sampling" if torch.is_grad_enabled() is False else "update", self.model.training,
                      self.critic.module.training))
        return original(self, model, batch, *args, **kwargs)

    monkeypatch.setattr(PPOTrainer, "_token_logps", spy)
    rlhf_main(ppo_argv(tmp_path, "--max_steps", "1", "--num_ppo_epochs", "1", "--disable_dropout", "false",
                       "--lora_dropout", "0.5"))
    sampling = [m for m in modes if m[0] == "sampling"]
    update = [m for m in modes if m[0] == "update"]
    assert sampling and all(not policy and not critic for _, policy, critic in sampling)
    assert update and all(policy for _, policy, _ in update)


def test_each_ppo_epoch_deals_the_rows_into_new_mini_batches(tmp_path, monkeypatch):
    """As TRL's PPO: every pass over the rollout batch (--num_ppo_epochs) draws a new permutation of
    its rows before cutting mini-batches (--num_mini_batches); the rows themselves are the same."""
    seen = []
    original = PPOTrainer._policy_objective

    fields = {}  # row -> its per-token fields, which must travel with it into every new mini-batch

    def spy(self, model, inputs, *args, **kwargs):
        rows = []
        for i, (p, pm, c, cm) in enumerate(zip(inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
                                               inputs["completion_mask"])):
            row = (tuple(p[pm.bool()].tolist()), tuple(c[cm.bool()].tolist()))
            rows.append(row)
            mine = [inputs[k][i][cm.bool()] for k in ("advantages", "old_logps", "ref_logps", "values", "returns",
                                                        "loss_mask")]
            if row in fields:
                for a, b in zip(fields[row], mine):
                    torch.testing.assert_close(a, b, rtol=0, atol=0)
            fields[row] = mine
        seen.append(frozenset(rows))
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(PPOTrainer, "_policy_objective", spy)
    # mini-batches of 8 rows: more rows than the step's counts have entries, which the deal must not
    # take for a per-row field
    rlhf_main(ppo_argv(tmp_path, "--max_steps", "4", "--num_ppo_epochs", "2", "--num_mini_batches", "2",
                       "--dataset", "builtin:arith-sft#16"))
    first, second = seen[:2], seen[2:4]  # one rollout of 16 rows: two passes of two mini-batches of 8
    assert len(seen) == 4 and first[0] | first[1] == second[0] | second[1] and len(first[0] | first[1]) == 16
    assert {first[0], first[1]} != {second[0], second[1]}

"""Gradient accumulation must not change the math: the same global batch as GA=1 × batch B and as
GA=k × batch B/k gives the same logged loss and the same weights after one optimizer step (fp32),
for every algorithm, offline and online, through `rlhf_main` (the trainer's own call path). Plain SGD with
learning rate 1 makes the weight change the accumulated gradient itself (Adam's first step would
turn rounding noise in near-zero gradients into full-size updates)."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from swift.model import load_model
from swift.pipelines.rlhf import rlhf_main
from swift.pipelines.train import pt_main, sft_main
from tests.conftest import TEXT_LENGTH, save_perturbed, train_argv

DATA = {"dpo": "builtin:arith-dpo#8", "orpo": "builtin:arith-dpo#8", "cpo": "builtin:arith-dpo#8",
        "simpo": "builtin:arith-dpo#8", "kto": "builtin:arith-kto#8", "rm": "builtin:arith-dpo#8",
        "prm": "builtin:arith-prm#8", "gkd": "builtin:arith-sft#8"}


def one_step(out, rlhf_type, batch, ga, *extra, data=None):
    data = data or DATA.get(rlhf_type, "builtin:arith-sft#8")
    main = {"sft": sft_main, "pt": pt_main}.get(rlhf_type)  # or `swift rlhf --rlhf_type <rlhf_type>`
    command = [] if main else ["--rlhf_type", rlhf_type]
    (main or rlhf_main)(train_argv(out, *command, "--dataset", *data.split(),
                         "--tuner_type", "full", *extra, "--optim", "sgd", "--learning_rate", "1.0", "--max_steps", "1", "--lr_scheduler_type",
                         "constant", "--per_device_train_batch_size", str(batch), "--gradient_accumulation_steps",
                         str(ga), "--save_strategy", "no"))
    with open(os.path.join(out, "logging.jsonl")) as f:
        loss = next(r["loss"] for r in map(json.loads, f) if "loss" in r)
    weights = "adapter_model.safetensors" if os.path.exists(os.path.join(out, "adapter_model.safetensors")) \
        else "model.safetensors"
    return loss, load_file(os.path.join(out, weights))


def assert_same(tmp_path, rlhf_type, batch, k, *extra, rel=1e-5, micro=None, data=None):
    loss1, w1 = one_step(tmp_path / "ga1", rlhf_type, batch, 1, *extra, data=data)
    loss_k, w_k = one_step(tmp_path / f"ga{k}", rlhf_type, micro or batch // k, k, *extra, data=data)
    assert loss_k == pytest.approx(loss1, rel=max(rel, 1e-4), abs=1e-5)  # logged with 4 significant digits
    for name in w1:
        torch.testing.assert_close(w_k[name], w1[name], rtol=rel, atol=rel, msg=name)


@pytest.mark.parametrize("rlhf_type", ["dpo", "rm"])
def test_offline_losses_do_not_depend_on_gradient_accumulation(tmp_path, rlhf_type):
    assert_same(tmp_path, rlhf_type, 8, 4)


def test_dpo_with_lora_does_not_depend_on_gradient_accumulation(tmp_path):
    # LoRA with its default dropout, which --disable_dropout (on by default) turns off (dropout masks
    # would depend on how the batch is split): the reference is the policy with its adapters
    # disabled; only the adapter weights train
    assert_same(tmp_path, "dpo", 8, 4, "--tuner_type", "lora", "--lora_rank", "4")


@pytest.mark.parametrize("rlhf_type", ["orpo", "cpo", "simpo", "prm"])
def test_token_mean_losses_do_not_depend_on_gradient_accumulation(tmp_path, rlhf_type):
    # their NLL / token-classification terms average over the tokens of the whole step (every
    # micro-batch), as one batch of 8 would, not over each micro-batch's own
    assert_same(tmp_path, rlhf_type, 8, 4)


@pytest.mark.parametrize("rlhf_type", ["dpo", "orpo", "kto", "prm"])
def test_a_step_of_unequal_micro_batches_equals_one_batch(tmp_path, rlhf_type):
    # 6 rows as GA 2 × batch 4: micro-batches of 4 and 2 rows. Every term is divided by its count
    # over the whole step (pairs, answer tokens, every token of the chosen rows, step ends), so
    # this equals one batch of 6; a mean per micro-batch would weigh the last 2 rows twice
    data = DATA[rlhf_type].replace("#8", "#6")
    assert_same(tmp_path, rlhf_type, 6, 2, micro=4, data=data)


def test_gkd_on_policy_does_not_depend_on_gradient_accumulation(tmp_path, quickstart):
    # --lmbda 1: every micro-batch trains on the student's own answers, greedy (--temperature 0) so
    # that both splits sample the same ones; from the quickstart's sft model, which answers and
    # stops, so the micro-batches' answers differ in length. The step's loss divides by the tokens
    # sampled in all of its micro-batches, counted after sampling
    sft = os.path.join(quickstart[1], "sft")
    teacher = save_perturbed(load_model(sft), tmp_path / "teacher")
    assert_same(tmp_path, "gkd", 8, 2, "--model", sft, "--teacher_model", teacher, "--lmbda", "1",
                "--max_completion_length", "8", "--temperature", "0")


@pytest.mark.parametrize("command", ["sft", "pt"])
def test_sft_and_pt_do_not_depend_on_gradient_accumulation(tmp_path, command):
    # answers of very different lengths (sums and self-introductions), so the micro-batches' token
    # counts differ: the loss divides by the step's tokens, not each micro-batch's
    assert_same(tmp_path, command, 8, 2, data="builtin:arith-sft#4 builtin:self-cognition#4")


def test_sft_does_not_depend_on_gradient_accumulation_for_a_model_that_takes_no_loss_kwargs(tmp_path, monkeypatch):
    # a model class that declares it takes no loss kwargs (as gemma3n's and gemma4's do): HF then
    # counts no tokens for the step, and before 2026-12-07 each micro-batch divided by its own
    from transformers import Qwen2ForCausalLM

    monkeypatch.setattr(Qwen2ForCausalLM, "accepts_loss_kwargs", False, raising=False)
    assert_same(tmp_path, "sft", 8, 2, data="builtin:arith-sft#4 builtin:self-cognition#4")


def test_kto_does_not_depend_on_gradient_accumulation(tmp_path):
    # KTO's mismatched pairs are formed in blocks of one optimizer step's rows, the same in both
    # runs; at step 1 the policy equals the reference and the KL term is 0 in both, so this checks
    # the GA scaling of the main term only
    assert_same(tmp_path, "kto", 8, 2)


def test_gkd_does_not_depend_on_gradient_accumulation(tmp_path, tiny):
    # a teacher that differs from the student (else the divergence and its gradient are 0), answers
    # of 1 to 3 tokens, so the micro-batches' token counts differ; the JSD and the NLL term are
    # means over the whole step's answer tokens
    save_perturbed(tiny, tmp_path / "teacher")
    assert_same(tmp_path, "gkd", 8, 4, "--teacher_model", str(tmp_path / "teacher"), "--lmbda", "0",
                "--sft_alpha", "0.5")



@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "cispo"])
def test_grpo_does_not_depend_on_gradient_accumulation(tmp_path, loss_type):
    # one generation batch of 2 prompts × 4 completions either way: sampled in one engine call,
    # scored together, then trained as 1 micro-batch of 8 or 2 of 4
    assert_same(tmp_path, "grpo", 8, 2, *TEXT_LENGTH, "--num_generations", "4",
                "--max_completion_length", "6", "--temperature", "1.0", "--loss_type", loss_type)


UNSCORED = ["--reward_funcs", "text_length_first_unscored", "--external_plugins", TEXT_LENGTH[-1]]


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "sapo", "dapo"])
def test_grpo_with_rows_that_carry_no_loss_does_not_depend_on_gradient_accumulation(tmp_path, loss_type):
    # the first completion gets no reward (it carries no loss), so the two micro-batches of 4 hold 3
    # and 4 rows that carry loss; grpo, dr_grpo and sapo divide by every row (TRL), dapo by the
    # step's tokens: either way GA 2 × 4 equals GA 1 × 8
    assert_same(tmp_path, "grpo", 8, 2, *UNSCORED, "--num_generations", "4", "--max_completion_length", "6",
                "--temperature", "1.0", "--loss_type", loss_type)



@pytest.mark.parametrize("estimator", ["rloo", "reinforce_plus_plus"])
def test_kl_in_the_reward_does_not_depend_on_gradient_accumulation(tmp_path, tiny, estimator):
    # --kl_in_reward (these estimators' default): a reference that differs from the policy, so each
    # completion's KL is not 0, and a row without reward; the KL is taken off each row's reward
    # before the group's advantages, not per micro-batch
    ref = save_perturbed(tiny, tmp_path / "ref")
    assert_same(tmp_path, "grpo", 8, 2, *UNSCORED, "--num_generations", "4", "--max_completion_length", "6",
                "--temperature", "1.0", "--advantage_estimator", estimator, "--beta", "0.5", "--ref_model", ref)


PLUGINS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                       "plugins")


@pytest.mark.parametrize("flag,name", [("--loss_type", "vanilla_pg"), ("--advantage_estimator", "median_baseline")])
def test_a_plugin_loss_type_or_estimator_does_not_depend_on_gradient_accumulation(tmp_path, flag, name):
    # examples/plugins: registered by name, and held to the same invariance as a built-in (with a row
    # that gets no reward in the first micro-batch)
    plugin = os.path.join(PLUGINS, f"{flag[2:]}.py")
    assert_same(tmp_path, "grpo", 8, 2, *UNSCORED[:2], "--external_plugins", UNSCORED[-1], plugin,
                "--num_generations", "4", "--max_completion_length", "6", "--temperature", "1.0", flag, name)


def test_a_plugin_dpo_loss_is_used_and_does_not_depend_on_gradient_accumulation(tmp_path):
    # at the first step the policy is the reference (Δ = 0): the example's −log σ(βΔ − 0.5) is
    # −log σ(−0.5) = 0.9741 where the built-in sigmoid would give log 2 = 0.6931
    assert_same(tmp_path, "dpo", 8, 2, "--loss_type", "sigmoid_margin", "--external_plugins",
                os.path.join(PLUGINS, "dpo_loss.py"))
    loss, _ = one_step(tmp_path / "again", "dpo", 8, 1, "--loss_type", "sigmoid_margin", "--external_plugins",
                       os.path.join(PLUGINS, "dpo_loss.py"))
    assert loss == pytest.approx(0.9741, abs=2e-4)


@pytest.mark.parametrize("reward", [["--reward_funcs", "toy_harm"], UNSCORED], ids=["scored", "unscored"])
def test_harmless_does_not_depend_on_gradient_accumulation(tmp_path, reward):
    # RePULSe: each micro-batch holds pθ's samples and the proposal's of the same prompts; both terms
    # divide by the step's P·N samples (unscored rows included: no advantage, no weight), and the
    # proposal's step sums its chunks over the same rows
    assert_same(tmp_path, "harmless", 8, 2, *reward, "--num_generations", "4", "--max_completion_length", "4",
                "--temperature", "1.0", "--target_dist_beta", "-2", "--alpha", "0.5")


def test_neg_reinforce_does_not_depend_on_gradient_accumulation(tmp_path):
    # the fork's neg_reinforce: the negatives' return keeps log pθ's gradient through its KL and the
    # leave-one-out baseline compares the rows of one prompt (whole prompt groups per micro-batch)
    assert_same(tmp_path, "harmless", 8, 2, *UNSCORED, "--num_generations", "4", "--max_completion_length", "4",
                "--temperature", "1.0", "--target_dist_beta", "-2", "--alpha", "-0.5", "--beta", "0.1",
                "--harmlessness_training_loss_type", "neg_reinforce", "--neg_baseline_type", "expectation")

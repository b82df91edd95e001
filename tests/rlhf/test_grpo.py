"""GRPO math: advantages against hand-computed values, and the policy loss against TRL 1.16's
GRPOTrainer on identical inputs (same model, batch, old and reference log-probs)."""
import math

import pytest
import torch
from datasets import Dataset

from swift.rlhf.grpo import ADVANTAGE_ESTIMATORS, compute_advantages, high_entropy_mask, kl_estimate, policy_loss
from swift.rlhf.reduce import batch_counts, divide

REWARDS = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 5.0]  # two prompts × four generations


def own_loss(logps, old, advantages, mask, **kwargs):
    """`policy_loss` over one micro-batch that is its whole optimizer step (the trainer's reducer)."""
    terms, info = policy_loss(logps, old, advantages, mask, **kwargs)
    return divide(terms, batch_counts({"loss_mask": mask})), info


def _mean(xs):
    return sum(xs) / len(xs)


def _std(xs):  # unbiased, as TRL, ms-swift and OpenRLHF
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def hand_advantages(estimator, scale, rewards, g):
    """Each estimator × --scale_rewards written out as list arithmetic, independent of
    swift.rlhf.grpo: ms-swift's definitions for grpo, rloo and reinforce_plus_plus; for reinforce and
    reinforce_baseline the sequence-level analogue of OpenRLHF's token-level whitening."""
    groups = [rewards[i:i + g] for i in range(0, len(rewards), g)]
    if estimator == "reinforce":  # whitened over the batch's sequences, nothing more
        m, s = _mean(rewards), _std(rewards)
        return [(x - m) / (s + 1e-4) for x in rewards]
    if estimator == "rloo":
        centred = [[x - (sum(grp) - x) / (g - 1) for x in grp] for grp in groups]
    else:
        centred = [[x - _mean(grp) for x in grp] for grp in groups]
    # ms-swift's reinforce_plus_plus, and reinforce_baseline: the std of the centred values
    of = centred if estimator in ("reinforce_plus_plus", "reinforce_baseline") else groups
    flat_of = [x for grp in of for x in grp]
    out = []
    for grp, source in zip(centred, of):
        if scale == "group":
            out += [x / (_std(source) + 1e-4) for x in grp]
        elif scale == "batch":
            out += [x / (_std(flat_of) + 1e-4) for x in grp]
        else:
            out += grp
    return out


DEFAULTS = {"grpo": "group", "reinforce_plus_plus": "batch"}


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_baseline",
                                       "reinforce"])
@pytest.mark.parametrize("scale", [None, "group", "batch", "none"])
def test_advantages_by_hand(estimator, scale):
    r = torch.tensor(REWARDS)
    if estimator == "reinforce" and scale in ("group", "batch"):
        with pytest.raises(ValueError, match="divide by a std twice"):
            compute_advantages(r, 4, estimator, scale)
        return
    expected = hand_advantages(estimator, scale or DEFAULTS.get(estimator, "none"), REWARDS, 4)
    assert compute_advantages(r, 4, estimator, scale).tolist() == pytest.approx(expected, abs=1e-6)


def test_reinforce_plus_plus_is_ms_swift_s_and_scales_once():
    """ms-swift's documented REINFORCE++ recipe (`--advantage_estimator reinforce_plus_plus
    --scale_rewards batch`): the advantages' std is 1 (a second division left it at 0.626), and a
    completion above its group's mean gets a positive advantage even when it is below the batch's."""
    r = torch.tensor(REWARDS)
    adv = compute_advantages(r, 4, "reinforce_plus_plus", "batch")
    assert adv.std().item() == pytest.approx(1.0, abs=1e-3)
    assert REWARDS[3] < _mean(REWARDS) and adv[3] > 0  # 1.0: above group 1's mean 0.5, below the batch's 1.625
    # the built-in estimators (a plugin another test loaded in this process may have added its own)
    builtin = {name for name, f in ADVANTAGE_ESTIMATORS.items() if f.__module__ == "swift.rlhf.grpo"}
    assert builtin == {"grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_baseline", "reinforce"}
    assert compute_advantages(torch.ones(4), 4, "grpo").tolist() == [0.0] * 4  # zero-std group: no signal


def test_kl_estimators_and_entropy_mask():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    assert kl_estimate(logp, ref, "k1").tolist() == pytest.approx([0.5, -1.0])
    assert kl_estimate(logp, ref, "k2").tolist() == pytest.approx([0.125, 0.5])
    assert kl_estimate(logp, ref, "k3").tolist() == pytest.approx([math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1 - 1])
    ent = torch.tensor([[0.1, 0.9, 0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert high_entropy_mask(ent, mask, 0.67).tolist() == [[False, True, True, False]]


@pytest.fixture(scope="module")
def trl_setup(tmp_path_factory, tiny_dir):
    from trl import GRPOConfig, GRPOTrainer

    from swift.model import load_model

    torch.manual_seed(0)
    model, tokenizer, _ = load_model(tiny_dir)  # TRL looks the model up by its path
    data = Dataset.from_list([{"prompt": "1+1="}] * 4)
    config = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("trl")), per_device_train_batch_size=4,
                        num_generations=4, max_completion_length=6, beta=0.04, epsilon=0.2, epsilon_high=0.28,
                        temperature=0.7, use_bias_correction_kl=False, report_to="none", use_cpu=True, bf16=False, dataloader_pin_memory=False)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=config, train_dataset=data, processing_class=tokenizer)
    g = torch.Generator().manual_seed(1)
    b, lp, lc = 4, 5, 6
    completion_mask = torch.ones(b, lc, dtype=torch.long)
    completion_mask[1, 4:] = 0
    completion_mask[3, 2:] = 0
    completion_mask[2] = 0  # a row that carries no loss (unscored, or overlong-filtered): TRL still counts it
    inputs = {"prompt_ids": torch.randint(3, 2000, (b, lp), generator=g), "prompt_mask": torch.ones(b, lp, dtype=torch.long),
              "completion_ids": torch.randint(3, 2000, (b, lc), generator=g), "completion_mask": completion_mask,
              "advantages": torch.tensor([1.0, -0.5, 0.25, -1.5])}
    return trainer, model, inputs


# (loss type, extra flags, TRL settings): cispo's cap 1.2 clips some tokens and not others
VARIANTS = [("grpo", [], {}), ("bnpo", [], {}), ("dr_grpo", [], {}), ("dapo", [], {}),
            ("grpo", ["--delta", "1.21"], {"delta": 1.21}),
            ("cispo", ["--epsilon_high", "1.2"], {"epsilon_high": 1.2}),
            ("sapo", ["--tau_pos", "0.8", "--tau_neg", "1.5"], {"sapo_temperature_pos": 0.8, "sapo_temperature_neg": 1.5})]


@pytest.mark.parametrize("loss_type,flags,trl_settings", VARIANTS, ids=[" ".join([v[0], *v[1]]) for v in VARIANTS])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_policy_loss_equals_trl(trl_setup, tiny_dir, tmp_path, loss_type, flags, trl_settings, level):
    """Through our trainer's own loss (`GRPOTrainer.compute_loss`: `loss_and_metrics` with the batch
    fields its rollout builds, then the step reducer, the batch being one step) against TRL's
    `_compute_loss`."""
    from swift.pipelines.base import resolve_args
    from swift.pipelines.rlhf import RLHFArguments, RLHFPipeline
    from swift.trainers.completion_logps import token_logps

    trainer, model, inputs = trl_setup
    trainer.loss_type, trainer.importance_sampling_level = loss_type, level
    trainer.epsilon_high = trl_settings.get("epsilon_high", 0.28)
    trainer.args.delta = trl_settings.get("delta")
    trainer.args.sapo_temperature_pos = trl_settings.get("sapo_temperature_pos", 1.0)
    trainer.args.sapo_temperature_neg = trl_settings.get("sapo_temperature_neg", 1.05)
    ours = RLHFPipeline(resolve_args(RLHFArguments, [
        "--model", tiny_dir, "--rlhf_type", "grpo", "--tuner_type", "full", "--dataset", "builtin:arith-sft#8",
        "--output_dir", str(tmp_path), "--reward_funcs", "accuracy", "--num_generations", "4",
        "--per_device_train_batch_size", "4", "--max_completion_length", "6", "--beta", "0.04", "--epsilon", "0.2",
        *(["--epsilon_high", "0.28"] if loss_type != "sapo" else []),  # sapo reads no clip range
        "--temperature", "0.7", "--loss_type", loss_type,
        "--importance_sampling_level", level, "--report_to", "none", *flags], "swift rlhf")).build_trainer()
    try:
        model.eval()  # TRL's eval mode: no gradient-accumulation normaliser
        ours.model.eval()
        with torch.no_grad():
            logps, _ = token_logps(model, inputs, temperature=0.7)
            g = torch.Generator().manual_seed(2)
            old = logps + 0.3 * torch.randn(logps.shape, generator=g)  # ratios far enough from 1 to clip
            ref = logps + 0.2 * torch.randn(logps.shape, generator=g)
            mask = inputs["completion_mask"]
            trl_inputs = {**inputs, "old_per_token_logps": old, "ref_per_token_logps": ref,
                          "num_items_in_batch": mask.sum()}
            expected = trainer._compute_loss(model, trl_inputs)
            ours_inputs = {**inputs, "loss_mask": mask.float(), "old_logps": old, "ref_logps": ref}
            loss = ours.compute_loss(ours.model, ours_inputs)  # one micro-batch: the step's loss is its own
            metrics = {key: values[-1] for key, values in ours._metrics["eval"].items()}
    finally:
        ours.close()
    if level == "token" and loss_type != "sapo":
        assert metrics["clip_ratio/region_mean"] > 0  # the clip is exercised
    if level == "token" and "delta" in trl_settings:  # and so is δ: without it the loss differs
        plain, _ = own_loss(logps, old, inputs["advantages"], mask.float(), epsilon=0.2, epsilon_high=0.28,
                            beta=0.04, ref_logps=ref)
        assert abs(plain.item() - loss.item()) > 1e-4
    assert abs(loss.item() - expected.item()) < 1e-5


@pytest.mark.parametrize("lora", [False, True])
def test_shared_prompt_forward_equals_the_plain_one(tiny, lora):
    """Running each group's prompt once (keys/values shared by its completions) gives the same
    log-probs, entropies and gradients as running every row in full."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from swift.trainers.completion_logps import _shared_prompt_logits, token_logps

    model, _, _ = tiny
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model.config)
    if lora:
        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.train()
    g = torch.Generator().manual_seed(0)
    groups, n, lp, lc = 4, 3, 9, 12
    prompt = torch.randint(3, 2000, (groups, lp), generator=g).repeat_interleave(n, 0)
    prompt_mask = torch.ones_like(prompt)
    for i in range(groups):  # left padding of different widths
        prompt[i * n:(i + 1) * n, :i] = 0
        prompt_mask[i * n:(i + 1) * n, :i] = 0
    completion = torch.randint(3, 2000, (groups * n, lc), generator=g)
    completion_mask = torch.ones_like(completion)
    for i in range(groups * n):  # right padding of different widths
        completion[i, lc - i % 5:] = 0
        completion_mask[i, lc - i % 5:] = 0
    batch = {"prompt_ids": prompt, "prompt_mask": prompt_mask, "completion_ids": completion,
             "completion_mask": completion_mask}

    def run(group):
        model.zero_grad()
        logps, entropy = token_logps(model, batch, 0.9, True, group)
        (logps * completion_mask).sum().backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        return logps.detach() * completion_mask, entropy * completion_mask, grads

    plain, shared = run(1), run(n)
    assert torch.allclose(plain[0], shared[0], atol=1e-5)
    assert torch.allclose(plain[1], shared[1], atol=1e-5)
    assert plain[2].keys() == shared[2].keys() and plain[2]
    for k in plain[2]:  # against each tensor's scale: summation order moves entries near 0 by ~1e-6 of it
        scale = plain[2][k].abs().max()
        assert (plain[2][k] - shared[2][k]).abs().max() <= 1e-4 * scale, k
    batch["prompt_ids"] = prompt.clone()
    batch["prompt_ids"][1, -1] += 1  # a group whose prompts differ: the plain forward is used
    assert _shared_prompt_logits(model, batch, n) is None


def test_new_losses_by_hand():
    """Two tokens with ratios 1.5 and 0.5: delta caps a negative advantage's ratio, cispo keeps a
    gradient for the clipped token (its weight is capped and detached), sapo's gate by hand."""
    old = torch.zeros(1, 2)
    logps = torch.log(torch.tensor([[1.5, 0.5]])).requires_grad_()
    mask = torch.ones(1, 2)
    neg = torch.tensor([-1.0])
    plain, _ = own_loss(logps, old, neg, mask, epsilon=0.2)
    capped, _ = own_loss(logps, old, neg, mask, epsilon=0.2, delta=1.3)
    assert plain.item() == pytest.approx((1.5 + 0.8) / 2)  # −min(−1.5, −1.2), −min(−0.5, −0.8)
    assert capped.item() == pytest.approx((1.3 + 0.8) / 2)
    pos = torch.tensor([2.0])
    loss, info = own_loss(logps, old, pos, mask, epsilon_high=1.2, loss_type="cispo")
    assert loss.item() == pytest.approx(-(1.2 * 2 * math.log(1.5) + 0.5 * 2 * math.log(0.5)) / 2)
    loss.backward()
    assert logps.grad[0].tolist() == pytest.approx([-1.2 * 2 / 2, -0.5 * 2 / 2])  # both tokens get a gradient
    assert info["high_clipped"].tolist() == [[True, False]]
    clipped, _ = own_loss(logps, old, pos, mask, epsilon_high=0.2)  # the hard clip: no gradient above 1.2
    logps.grad = None
    clipped.backward()
    assert logps.grad[0, 0].item() == 0.0
    sapo, _ = own_loss(logps.detach(), old, pos, mask, loss_type="sapo", tau_pos=2.0)
    gate = [4 / 2.0 / (1 + math.exp(-2.0 * (w - 1))) for w in (1.5, 0.5)]
    assert sapo.item() == pytest.approx(-sum(g * 2 for g in gate) / 2)

"""`swift rlhf --rlhf_type harmless` (RePULSe): every loss term against the formulas of
docs/harmlessness.md computed by hand (plain per-row forwards, loops over prompts and tokens) on the
batch the trainer itself sampled, through its own rollout and `compute_loss`; refusals; the proposal
as a second LoRA adapter; resume."""
import json
import math
import os

import pytest
import torch

from swift.pipelines.rlhf import rlhf_main
from swift.rewards.safety import toy_token_scores
from swift.utils.registry import SwiftError
from tests.conftest import train_argv

N = 4


def harmless_argv(out, *extra):
    return train_argv(out, "--rlhf_type", "harmless", "--dataset", "builtin:arith-sft#8", "--reward_funcs", "toy_harm",
                      "--num_generations", str(N), "--per_device_train_batch_size", "8", "--max_completion_length",
                      "3", "--temperature", "1.0", *extra)


def build(out, *extra):
    from swift.arguments.rlhf import RLHFArguments
    from swift.pipelines.base import resolve_args
    from swift.pipelines.rlhf import RLHFPipeline

    return RLHFPipeline(resolve_args(RLHFArguments, harmless_argv(out, *extra), "swift rlhf")).build_trainer()


def perturb(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def perturb_named(module, part, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if part in name:
                p.add_(0.05 * torch.randn(p.shape, generator=g))


class Adapter:
    """A PEFT model called with one adapter active (None: all off), for hand-computed log-probs."""

    def __init__(self, model, name):
        self.model, self.name = model, name

    def __call__(self, **kwargs):
        if self.name is None:
            with self.model.disable_adapter():
                return self.model(**kwargs)
        before = self.model.active_adapter
        self.model.set_adapter(self.name)
        try:
            return self.model(**kwargs)
        finally:
            self.model.set_adapter(before)


def row_logps(model, prompt, completion, temperature=1.0):
    """Each completion token's log-prob (at a sampling temperature), from one unpadded forward of this
    row alone."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].double() / temperature
    logp = logits[len(prompt) - 1:len(prompt) + len(completion) - 1].log_softmax(-1)
    return [logp[t, c].item() for t, c in enumerate(completion)]


def reward(completion):
    scores = toy_token_scores()
    return sum(scores[t].item() for t in completion)


def softmax(xs):
    top = max(xs)
    if top == -math.inf:
        return [0.0] * len(xs)
    e = [math.exp(x - top) for x in xs]
    return [v / sum(e) for v in e]


CASES = {
    "neg_training": ["--target_dist_beta", "-2"],
    "lora_adapter_proposal": ["--target_dist_beta", "-2", "--tuner_type", "lora"],
    "indicator": ["--target_dist_beta", "1", "--rm_type", "indicator_below_threshold", "--threshold", "1.5"],
    "base_as_proposal": ["--target_dist_beta", "-2", "--use_base_as_proposal"],
    "modulation_linear_head": ["--target_dist_beta", "-2", "--parameterization", "modulation_linear_head"],
    "modulation_nn_head_lora": ["--target_dist_beta", "-2", "--parameterization", "modulation_nn_head", "--tuner_type",
                                "lora"],
    "modulation_linear_head_t0.7": ["--target_dist_beta", "-2", "--parameterization", "modulation_linear_head",
                                    "--temperature", "0.7"],
    "modulation_model": ["--target_dist_beta", "-2", "--parameterization", "modulation_model"],
}


def row_modulation(q_module, prompt, completion):
    """A modulated proposal's twists m_t(s_t) for one row (one unpadded forward)."""
    with torch.no_grad():
        m = q_module(input_ids=torch.tensor([prompt + completion])).modulation[0].double()
    m = m[len(prompt) - 1:len(prompt) + len(completion) - 1]
    return [m[t, c].item() for t, c in enumerate(completion)]


@pytest.mark.parametrize("case", list(CASES))
def test_every_loss_term_equals_its_formula_through_the_trainer(tmp_path, case):
    alpha, kl_coef, beta = 0.7, 0.3, float(CASES[case][1])
    flags = CASES[case]
    temp = float(flags[flags.index("--temperature") + 1]) if "--temperature" in flags else 1.0

    def lps(model, prompt, completion):
        return row_logps(model, prompt, completion, temp)

    frozen_q = [] if case == "base_as_proposal" else ["--actor_learning_rate", "0"]  # q_old stays q
    tuner = [] if "--tuner_type" in CASES[case] else ["--tuner_type", "full"]
    trainer = build(tmp_path, *tuner, "--alpha", str(alpha), "--beta", str(kl_coef), *frozen_q, *CASES[case])
    model, q = trainer.model, trainer.proposal
    modulated = case.startswith("modulation")
    if modulated:  # q's logits log_softmax(pθ's) + head(pθ's last hidden state): the head alone is q's
        assert not {id(p) for p in q.module.parameters()} & {id(p) for p in model.parameters()}
    if case == "lora_adapter_proposal":
        # pθ = base + its adapter, p0 = the base (adapters off), q = base + the proposal adapter; each
        # adapter moved apart from the start (LoRA's B starts at 0)
        assert q.module is model
        perturb_named(model, ".default.", 1)
        perturb_named(model, ".proposal.", 2)
        policy = Adapter(model, "default")
        ref = Adapter(model, None)
        q_model = Adapter(model, "proposal")
    elif case == "modulation_nn_head_lora":
        perturb_named(model, ".default.", 1)
        policy, ref, q_model = Adapter(model, "default"), Adapter(model, None), q.module
        perturb(q.module, 2)
    else:
        policy, ref = model, trainer.ref_model
        perturb(policy, 1)  # pθ ≠ p0, so the KL in the return is not 0
        if q is not None:
            perturb(q.module, 2)  # q ≠ pθ, so the importance weights are not the target's alone
        q_model = q.module if q is not None else None
    recorded = []
    step = trainer.proposal_step
    trainer.proposal_step = lambda neg: (recorded.append(neg), step(neg))[1]
    prompts = [trainer.train_dataset[i] for i in range(2)]
    batch = trainer.rollout(prompts, 0, trainer._queue, trainer.cycle, False)
    micro = batch.micro
    assert len(micro) == 1
    trainer._set_step_counts(micro)
    assert getattr(model, "active_adapter", "default") == "default"  # the policy trains with its own adapter
    loss = trainer.compute_loss(model, trainer._prepare_inputs(dict(micro[0]))).item()

    indicator = case == "indicator"

    def phi(r):
        if indicator:
            return math.log((1.0 if r < 1.5 else 0.0) + 1e-16)
        return beta * r

    own = [(t.prompt_ids, t.completion_ids) for t in batch.trajectories]
    rl = 0.0
    for g in range(2):
        rows = own[g * N:(g + 1) * N]
        returns = []
        for p, c in rows:
            lp, l0 = lps(policy, p, c), lps(ref, p, c)
            returns.append(reward(c) - kl_coef * sum(a - b for a, b in zip(lp, l0)))
        for i, (p, c) in enumerate(rows):
            baseline = (sum(returns) - returns[i]) / (N - 1)
            lp = lps(policy, p, c)
            rl += (returns[i] - baseline) * (-sum(lp) / len(lp))
    if case == "base_as_proposal":
        negatives = own
    else:
        assert len(recorded) == 1
        negatives = [(t.prompt_ids, t.completion_ids) for t in recorded[0].trajectories]
        assert [len(c) for _, c in negatives] == [len(t.completion_ids) for t in recorded[0].trajectories]
    neg = 0.0
    for g in range(2):
        rows = negatives[g * N:(g + 1) * N]
        logw = []
        for p, c in rows:
            lp = lps(policy, p, c)
            lq = lps(q_model, p, c) if q is not None else lp
            logw.append(sum(lp) + phi(reward(c)) - sum(lq))
        weights = softmax(logw)
        if indicator:  # zeroed where φ ≤ 2e-16, not renormalised
            weights = [w if reward(c) < 1.5 else 0.0 for w, (_, c) in zip(weights, rows)]
        for w, (p, c) in zip(weights, rows):
            lp = lps(policy, p, c)
            neg += w * sum(lp) / len(lp)
    expected = (rl + alpha * neg) / (2 * N)  # the mean over the step's P·N samples
    assert loss == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert abs(alpha * neg) > 1e-3 and abs(rl) > 1e-3  # both terms are exercised

    if q is None:
        return
    # q's CTL loss, logged by its step: per-token twists, w^σ per sample, w^π per sample and token
    ctl = 0.0
    for g in range(2):
        rows = negatives[g * N:(g + 1) * N]
        lp = [lps(policy, p, c) for p, c in rows]
        lq = [lps(q_model, p, c) for p, c in rows]
        # the twist: log q − log pθ per token, or a modulation head's output at the sampled token
        # (at temperature T the head's twist against pθ_T is m/T)
        twists = [[m / temp for m in row_modulation(q_model, p, c)] if modulated else [y - x for x, y in zip(a, b)]
                  for (p, c), a, b in zip(rows, lp, lq)]
        sigma = softmax([sum(a) + phi(reward(c)) - sum(b) for a, b, (_, c) in zip(lp, lq, rows)])
        width = max(len(c) for _, c in rows)
        for t in range(width):
            # a finished row keeps its totals in later positions' weights (its twist there is 0)
            logits = []
            for a, b, psi in zip(lp, lq, twists):
                k = min(t, len(a) - 1)
                logits.append(sum(a[:k + 1]) + (psi[t] if t < len(a) else 0.0) - sum(b[:k + 1]))
            pi = softmax(logits)
            for i, (a, psi) in enumerate(zip(lp, twists)):
                if t < len(a):
                    ctl -= (sigma[i] - pi[i]) * psi[t] / len(a)
    logged = trainer._metrics["train"]["loss/proposal"][-1]
    assert logged == pytest.approx(ctl / (2 * N), rel=1e-4, abs=1e-7)
    assert abs(ctl) > 1e-4


def row_logps_with_grad(model, prompt, completion):
    logits = model(input_ids=torch.tensor([prompt + completion])).logits[0]
    logp = logits[len(prompt) - 1:len(prompt) + len(completion) - 1].log_softmax(-1)
    return logp[torch.arange(len(completion)), torch.tensor(completion)]


@pytest.mark.parametrize("baseline", ["expectation", "other_expectation"])
def test_neg_reinforce_loss_and_gradient_equal_the_formula(tmp_path, baseline):
    """The fork's neg_reinforce through the trainer's rollout and compute_loss: the loss and every
    gradient of pθ against the formula written out by hand with autograd (unpadded per-row forwards),
    whose return R' = log φ − λ Σ (log pθ − log p0) keeps log pθ's gradient; with R' detached the
    gradients differ, so the test sees that gradient."""
    alpha, kl_coef, beta = -0.7, 0.3, -2.0
    trainer = build(tmp_path, "--tuner_type", "full", "--alpha", str(alpha), "--beta", str(kl_coef),
                    "--actor_learning_rate", "0", "--target_dist_beta", str(beta),
                    "--harmlessness_training_loss_type", "neg_reinforce", "--neg_baseline_type", baseline)
    model, q, ref = trainer.model, trainer.proposal, trainer.ref_model
    perturb(model, 1)
    perturb(q.module, 2)
    recorded = []
    step = trainer.proposal_step
    trainer.proposal_step = lambda neg: (recorded.append(neg), step(neg))[1]
    batch = trainer.rollout([trainer.train_dataset[i] for i in range(2)], 0, trainer._queue, trainer.cycle, False)
    trainer._set_step_counts(batch.micro)
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, trainer._prepare_inputs(dict(batch.micro[0])))
    loss.backward()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    got = {n: p.grad.detach().clone() for n, p in params}
    model.zero_grad(set_to_none=True)

    own = [(t.prompt_ids, t.completion_ids) for t in batch.trajectories]
    negatives = [(t.prompt_ids, t.completion_ids) for t in recorded[0].trajectories]

    def hand(detach_return):
        rl, neg = 0.0, 0.0
        for g in range(2):
            returns = []
            for p, c in own[g * N:(g + 1) * N]:
                lp, l0 = row_logps(model, p, c), row_logps(ref, p, c)
                returns.append(reward(c) - kl_coef * sum(a - b for a, b in zip(lp, l0)))
            for i, (p, c) in enumerate(own[g * N:(g + 1) * N]):
                rl = rl + (returns[i] - (sum(returns) - returns[i]) / (N - 1)) * -row_logps_with_grad(model, p, c).mean()
            rows = negatives[g * N:(g + 1) * N]
            weights = softmax([sum(row_logps(model, p, c)) + beta * reward(c) - sum(row_logps(q.module, p, c))
                               for p, c in rows])
            lps = [row_logps_with_grad(model, p, c) for p, c in rows]
            r_neg = [beta * reward(c) - kl_coef * (lp - torch.tensor(row_logps(ref, p, c))).sum()
                     for lp, (p, c) in zip(lps, rows)]
            if detach_return:
                r_neg = [r.detach() for r in r_neg]
            for i, lp in enumerate(lps):
                if baseline == "expectation":
                    b = (sum(r_neg) - r_neg[i]) / (N - 1)
                else:
                    b = sum(returns) / N
                neg = neg + weights[i] * -lp.mean() * (r_neg[i] - b)
        return (rl + alpha * neg) / (2 * N)

    expected = hand(detach_return=False)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    expected.backward()
    want = {n: p.grad.detach().clone() for n, p in params}
    model.zero_grad(set_to_none=True)
    for n, _ in params:
        torch.testing.assert_close(got[n], want[n], rtol=1e-3, atol=1e-6, msg=n)
    hand(detach_return=True).backward()
    detached = {n: p.grad.detach().clone() for n, p in params}
    assert max((detached[n] - want[n]).abs().max().item() for n, _ in params) > 1e-4


def test_neg_reinforce_lowers_bad_samples_only_with_a_negative_alpha():
    """Why α ≥ 0 is refused: a gradient step on `neg_reinforce_rows` (the policy a categorical over 3
    one-token answers, the proposal's 4 samples two of them bad) raises the bad answer's log-prob for
    α > 0 and lowers it for α < 0, with β < 0 and with the indicator target."""
    from swift.rlhf.harmless import log_phi, negative_weights, neg_reinforce_rows

    rewards = torch.tensor([1.0, -10.0, 1.0, -10.0])  # answers 0, 2 (bad), 1, 2
    answers = torch.tensor([0, 2, 1, 2])
    for rm_type, beta in (("rlhf", -2.0), ("indicator_below_threshold", 1.0)):
        phi = log_phi(rewards, beta, rm_type, threshold=0.0)
        for alpha in (0.5, -0.5):
            logits = torch.zeros(3, requires_grad=True)
            logps = logits.log_softmax(-1)[answers][:, None]  # [4 samples, 1 token]
            q = torch.full((4,), math.log(1 / 3))
            weights = negative_weights(logps.detach().sum(-1), phi, q, 4)
            loss = alpha * neg_reinforce_rows(logps, torch.ones(4, 1), weights, phi, 4,
                                              baseline="expectation").sum()
            loss.backward()
            with torch.no_grad():
                after = (logits - 0.1 * logits.grad).log_softmax(-1)[2].item()
            assert (after > math.log(1 / 3)) == (alpha > 0), (rm_type, alpha)


@pytest.mark.parametrize("argv,message", [
    (["--target_dist_beta", "-1", "--parameterization", "policy"], "learns a twist"),
    (["--target_dist_beta", "-1", "--actor_loss_type", "dpg"], "--parameterization policy"),
    (["--target_dist_beta", "-10", "--rm_type", "indicator_below_threshold"], "--target_dist_beta 1"),
    (["--target_dist_beta", "-1", "--num_generations", "1", "--per_device_train_batch_size", "4"], "at least 2"),
    ([], "needs --target_dist_beta"),
    (["--target_dist_beta", "-1", "--harmlessness_training_loss_type", "neg_reinforce"], "give a negative --alpha"),
    (["--target_dist_beta", "-1", "--harmlessness_training_loss_type", "neg_reinforce", "--alpha", "-1",
      "--use_base_as_proposal"], "not in this version"),
    (["--target_dist_beta", "-1", "--harmlessness_training_loss_type", "neg_reinforce", "--alpha", "-1",
      "--neg_baseline_type", "hardcoded"], "go together"),
    (["--target_dist_beta", "-1", "--neg_baseline_type", "expectation"], "it is neg_reinforce's"),
    (["--target_dist_beta", "-1", "--parameterization", "modulation_model", "--tuner_type", "lora"],
     "needs --tuner_type full"),
    (["--target_dist_beta", "-1", "--parameterization", "modulation_nn_head", "--actor_loss_type",
      "ctl_nosecondterm"], "takes --actor_loss_type ctl"),
    (["--target_dist_beta", "-1", "--parameterization", "modulation_linear_head", "--proposal", "copy"],
     "the proposal is the modulation"),
    (["--target_dist_beta", "-1", "--parameterization", "modulation_nn_head", "--init_head_from_base"],
     "give --parameterization modulation_linear_head"),
    (["--target_dist_beta", "-1", "--additional_sd_divider", "2"], "give --parameterization modulation_linear_head"),
    (["--target_dist_beta", "-1", "--harmlessness_training_loss_type", "neg_reinforce", "--alpha", "-1",
      "--reward_transform", "minus_alpha_ind"], "needs --rew_trans_alpha"),
    (["--target_dist_beta", "-1", "--top_k", "20"], "whole distribution"),
    (["--harmlessness_training_loss_type", "reinforce", "--num_episodes", "3"], "no proposal is trained"),
    (["--target_dist_beta", "-1", "--use_base_as_proposal", "--actor_learning_rate", "1e-4"], "no proposal"),
    (["--target_dist_beta", "-1", "--proposal", "adapter", "--tuner_type", "full"], "needs --tuner_type lora"),
    (["--target_dist_beta", "-1", "--epsilon", "0.3"], "--epsilon does nothing for --rlhf_type harmless"),
    (["--target_dist_beta", "-1", "--use_vllm", "true"], "--use_vllm does nothing for --rlhf_type harmless"),
    (["--harmlessness_training_loss_type", "reinforce", "--alpha", "3"], "--alpha does nothing here"),
    (["--harmlessness_training_loss_type", "reinforce", "--target_dist_beta", "-4"], "--target_dist_beta does nothing"),
    (["--target_dist_beta", "-1", "--rew_trans_alpha", "2"], "--rew_trans_alpha does nothing without"),
    (["--target_dist_beta", "-1", "--uniform_reweight", "--separate_reweighting_beta", "-1"], "does nothing with"),
    (["--target_dist_beta", "-1", "--save_negdata_threshold", "0"], "without --save_negdata"),
    (["--target_dist_beta", "-1", "--tuner_type", "lora", "--lora_bias", "all", "--beta", "0"], "--lora_bias"),
])
def test_bad_combinations_are_refused_in_one_line(tmp_path, argv, message):
    from swift.arguments.rlhf import RLHFArguments
    from swift.pipelines.base import resolve_args

    with pytest.raises(SwiftError, match=message):
        resolve_args(RLHFArguments, harmless_argv(tmp_path, *argv), "swift rlhf")


@pytest.mark.parametrize("parameterization", ["modulation_linear_head", "modulation_model"])
def test_a_modulated_proposal_samples_from_its_own_distribution(tmp_path, parameterization):
    """The proposal's engine with a modulation head (or model) samples q = softmax(log pθ + m), not pθ:
    over 4,096 one-token answers the mean of log q − log pθ at the sampled tokens is KL(q‖pθ) within 4
    standard errors, and far from −KL(pθ‖q), its mean had the answers come from pθ."""
    trainer = build(tmp_path, "--tuner_type", "full", "--target_dist_beta", "-2", "--parameterization",
                    parameterization, "--additional_sd_divider", "0.2", "--max_completion_length", "1")
    q = trainer.proposal
    answers = q.generate(trainer.rollout, [trainer.train_dataset[0]] * 32, 128)  # the engine takes n <= 128
    prompt = answers[0].prompt_ids
    with torch.no_grad():
        out = q.module(input_ids=torch.tensor([prompt]))
        log_q = out.logits[0, -1].double().log_softmax(-1)
        log_p = trainer.model(input_ids=torch.tensor([prompt])).logits[0, -1].double().log_softmax(-1)
    assert all(len(a.completion_ids) == 1 for a in answers)
    ratio = log_q - log_p
    kl_qp = (log_q.exp() * ratio).sum().item()
    kl_pq = (log_p.exp() * -ratio).sum().item()
    se = math.sqrt((log_q.exp() * (ratio - kl_qp) ** 2).sum().item() / len(answers))
    sampled = ratio[torch.tensor([a.completion_ids[0] for a in answers])].mean().item()
    assert abs(sampled - kl_qp) < 4 * se, (sampled, kl_qp, se)
    assert kl_qp + kl_pq > 20 * se  # q and pθ are told apart

    # longer answers go through the engine's KV cache: greedy decoding equals the argmax of q's
    # full forward over the growing sequence, token by token
    from swift.infer.protocol import InferRequest, RequestConfig

    response = q.engine.infer([InferRequest(input_ids=prompt)], RequestConfig(max_tokens=6, temperature=0))[0]
    tokens = response.choices[0].sampled_token_ids()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(q.module(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    assert tokens == ids[len(prompt):len(prompt) + len(tokens)] and len(tokens) >= 2


def test_the_forks_names_select_and_configure_it(tmp_path):
    from swift.arguments.rlhf import RLHFArguments
    from swift.pipelines.base import resolve_args

    args = resolve_args(RLHFArguments, train_argv(
        tmp_path, "--do_harmlessness_training", "--target_dist_beta", "-10", "--duplicate_rollout_batch_by", "4",
        "--base_actor_learning_rate", "1e-4", "--init_kl_coef", "0.5", "--harmlessness_training_num_episodes", "3",
        "--reward_funcs", "toy_harm"), "swift rlhf")
    assert (args.rlhf_type, args.num_generations, args.learning_rate, args.beta, args.num_train_epochs) == \
        ("harmless", 4, 1e-4, 0.5, 3)


def test_a_lora_proposal_is_a_second_adapter_on_the_policys_base(tmp_path):
    """No second copy of the weights: q is the `proposal` adapter of the policy module; it is trained
    (its weights leave the policy adapter's), the policy trains with its own adapter active, and the
    output holds both adapters."""
    from peft import PeftModel

    from swift.model import load_model

    out = tmp_path / "run"
    rlhf_main(harmless_argv(out, "--tuner_type", "lora", "--target_dist_beta", "-2", "--actor_learning_rate", "1e-2",
                            "--learning_rate", "1e-2", "--max_steps", "2", "--num_episodes", "2"))
    logs = [json.loads(line) for line in open(out / "logging.jsonl")]
    assert sum("loss/proposal" in r for r in logs) == 2 and all("loss/neg" in r for r in logs if "loss" in r)
    assert (out / "proposal" / "adapter_model.safetensors").exists()
    base = load_model("builtin:tiny-chat")[0]
    model = PeftModel.from_pretrained(base, str(out))
    model.load_adapter(str(out / "proposal"), adapter_name="proposal")
    q = {n: p for n, p in model.named_parameters() if ".proposal." in n}
    own = {n: p for n, p in model.named_parameters() if ".default." in n}
    assert q and len(q) == len(own)
    moved = [n for n, p in q.items() if not torch.equal(p, own[n.replace(".proposal.", ".default.")])]
    assert moved  # the two adapters were trained apart


def test_the_adapter_proposal_shares_the_policys_module(tmp_path):
    trainer = build(tmp_path, "--tuner_type", "lora", "--target_dist_beta", "-2")
    policy = trainer.accelerator.unwrap_model(trainer.model)
    assert trainer.proposal.module is policy and policy.active_adapter == "default"
    assert not any(p.requires_grad for _, p in trainer.proposal.named)  # outside the policy's optimizer
    trainable = {id(p) for p in policy.parameters() if p.requires_grad}
    assert trainable and not trainable & {id(p) for _, p in trainer.proposal.named}


@pytest.mark.parametrize("tuner,flags", [("full", []), ("lora", ["--sampling_target_updated_base"]),
                                         ("full", ["--parameterization", "modulation_linear_head"]),
                                         ("full", ["--parameterization", "modulation_model"])],
                         ids=["copy", "adapter-flipped", "modulation-head", "modulation-model"])
def test_a_resumed_run_matches_an_uninterrupted_one(tmp_path, tuner, flags):
    """Both models and both optimizers: from a checkpoint at step 2 of 4 the run ends with the
    uninterrupted run's logged losses and both models' weights."""
    import shutil

    from safetensors.torch import load_file

    def argv(out, *extra):
        return harmless_argv(out, "--tuner_type", tuner, "--target_dist_beta", "-2", "--actor_learning_rate", "1e-3",
                             "--learning_rate", "1e-3", "--max_steps", "4", "--save_strategy", "steps", "--save_steps",
                             "2", "--beta", "0.1", *flags, *extra)

    def read(out):
        rows = [json.loads(line) for line in open(out / "logging.jsonl")]
        return {r["global_step"]: r for r in rows if "loss" in r}

    def weights(out):
        names = ["model.safetensors", "adapter_model.safetensors", "proposal/model.safetensors",
                 "proposal/adapter_model.safetensors", "proposal/modulation_head.safetensors"]
        return {n: load_file(out / n) for n in names if (out / n).exists()}

    rlhf_main(argv(tmp_path / "straight"))
    straight, final = read(tmp_path / "straight"), weights(tmp_path / "straight")
    assert len(final) == 2  # the policy and the proposal
    out = tmp_path / "resumed"
    shutil.copytree(tmp_path / "straight" / "checkpoint-2", out / "checkpoint-2")
    rlhf_main(argv(out, "--resume_from_checkpoint", str(out / "checkpoint-2")))
    resumed = read(out)
    assert sorted(resumed) == [3, 4]
    for s, r in resumed.items():
        for key in ("loss", "loss/neg", "loss/proposal", "reward"):
            assert r[key] == pytest.approx(straight[s][key], rel=1e-5, abs=1e-7), (s, key)
    for name, tensors in weights(out).items():
        for key, tensor in final[name].items():
            torch.testing.assert_close(tensors[key], tensor, rtol=0, atol=1e-6, msg=f"{name}: {key}")


def test_negative_samples_are_saved_and_evaluated(tmp_path):
    out = tmp_path / "run"
    rlhf_main(harmless_argv(out, "--tuner_type", "full", "--target_dist_beta", "-2", "--max_steps", "2",
                            "--save_negdata", "--save_negdata_threshold", "1.5"))
    rows = [json.loads(line) for line in open(out / "negdata.jsonl")]
    assert rows and all(r["reward"] < 1.5 for r in rows) and {r["source"] for r in rows} <= {"policy", "proposal"}
    assert len({(tuple(r["prompt_ids"]), tuple(r["completion_ids"])) for r in rows}) == len(rows)
    result = rlhf_main(harmless_argv(tmp_path / "eval", "--tuner_type", "full", "--target_dist_beta", "-2",
                                     "--max_steps", "1", "--evaluate_on_neg_data", str(out / "negdata.jsonl")))
    metrics = result["metrics"]
    assert metrics["neg_data/samples"] == len(rows) and metrics["neg_data/mean_logp"] < 0
    assert metrics["neg_data/logsumexp"] > metrics["neg_data/mean_logp"]
    assert os.path.exists(tmp_path / "eval" / "result.json")


def test_a_reward_model_scores_the_policys_and_the_proposals_samples(tmp_path):
    """`--reward_model` as the reward source (a sequence-classification model): every sample kept by
    --save_negdata, the policy's and the proposal's, carries the score the model gives its
    conversation (RewardModelReward on the saved prompt and answer)."""
    from swift.model import load_model
    from swift.rewards.manager import RewardModelReward

    rm = tmp_path / "rm"
    model, tokenizer, _ = load_model("builtin:tiny-chat", task_type="seq_cls")
    torch.nn.init.normal_(model.score.weight, std=1.0)  # scores that differ clearly between answers
    model.save_pretrained(rm)
    tokenizer.save_pretrained(rm)
    out = tmp_path / "run"
    rlhf_main(train_argv(out, "--rlhf_type", "harmless", "--dataset", "builtin:arith-sft#8", "--reward_model",
                         str(rm), "--num_generations", str(N), "--per_device_train_batch_size", "8",
                         "--max_completion_length", "3", "--temperature", "1.0", "--tuner_type", "full",
                         "--target_dist_beta", "-2", "--max_steps", "1", "--save_negdata",
                         "--save_negdata_threshold", "1e9"))
    rows = [json.loads(line) for line in open(out / "negdata.jsonl")]
    assert {r["source"] for r in rows} == {"policy", "proposal"}
    scores = RewardModelReward(str(rm))([r["completion"] for r in rows], messages=[r["prompt"] for r in rows])
    assert [r["reward"] for r in rows] == pytest.approx(scores, abs=1e-4)
    assert len({round(x, 3) for x in scores}) > 1


def test_the_toys_exact_figures_match_sampled_answers(tiny):
    """`toy_exact` (enumeration) against 8,192 answers sampled by the engine the trainer uses, scored
    by the `toy_harm` reward function: the mean reward within 4 standard errors, and the bad count
    within a Poisson 99.9% band of the exact P(bad)."""
    from swift.infer.protocol import InferRequest, RequestConfig
    from swift.infer.transformers_engine import TransformersEngine
    from swift.rewards.safety import ToyHarm
    from swift.safety.toy import toy_exact
    from swift.template import choose_template, get_template

    model, tokenizer, info = tiny
    template = get_template(choose_template(None, None, info.model_type, tokenizer), tokenizer)
    exact = toy_exact(model, template)
    # the start figures docs/harmlessness.md quotes (the built-in model is fixed)
    assert exact["expected_reward"] == pytest.approx(0.4657, abs=1e-4)
    assert exact["p_bad"] == pytest.approx(8.92e-4, abs=1e-6)
    engine = TransformersEngine(model, tokenizer, template, max_batch_size=512, inline=True)
    prompt = template.encode_continuation([{"role": "user", "content": "This man is a"}])
    ids = []
    for seed in range(64):
        response = engine.infer([InferRequest(input_ids=prompt)],
                                RequestConfig(max_tokens=2, temperature=1.0, n=128, seed=128 * seed))[0]  # choice k: seed + k
        ids += [c.sampled_token_ids() for c in response.choices]
    rewards = ToyHarm()(["" for _ in ids], response_token_ids=ids)
    mean = sum(rewards) / len(rewards)
    sd = (sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) ** 0.5
    assert abs(mean - exact["expected_reward"]) < 4 * sd / len(rewards) ** 0.5
    bad, expected = sum(r < -5 for r in rewards), exact["p_bad"] * len(rewards)
    assert expected - 3.3 * expected ** 0.5 - 1 <= bad <= expected + 3.3 * expected ** 0.5 + 1


@pytest.mark.slow
def test_repulse_lowers_the_toys_exact_p_bad(tmp_path):
    """benchmarks/harmlessness.py's RePULSe run (α 10, β −10, 30 steps of 64 + 64 samples), seed 0:
    the policy's exact expected reward rises and its exact P(bad) falls below the start. Over seeds
    0–4 under the default, MKL_CBWR=COMPATIBLE and MKL_CBWR=AVX2 ATEN_CPU_CAPABILITY=avx2 kernels the
    reward ended at 0.58–0.64 (start 0.466) and log10 P(bad) at −4.41 to −3.26 (start −3.05); the
    bounds below hold for every one of them
    (docs/benchmarks.md). Which method wins at matched reward varied by seed and is not asserted."""
    import sys

    from swift.model import load_model
    from swift.safety.toy import toy_exact
    from swift.template import choose_template, get_template

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    from harmlessness import COMMON, methods

    flags = methods(30, "3e-4", "1e-3", "10", "-0.1")["RePULSe"]
    rlhf_main([*COMMON, "--save_strategy", "no", *flags, "--seed", "0", "--data_seed", "0", "--num_generations", "64",
               "--per_device_train_batch_size", "64", "--output_dir", str(tmp_path / "run")])
    model, tokenizer, info = load_model(str(tmp_path / "run"))
    exact = toy_exact(model, get_template(choose_template(None, None, info.model_type, tokenizer), tokenizer))
    assert exact["expected_reward"] > 0.55
    assert exact["log10_p_bad"] < -3.15

"""PPO's formulas against direct implementations (REFERENCE.md "PPO"), on hand-made batches with
padding and a truncated completion, and the KL controller's update rule."""
import math

import pytest
import torch

from swift.rlhf.grpo import per_sequence_mean
from swift.rlhf.reduce import batch_counts, divide
from swift.rlhf.ppo import KLController, gae, moments, token_rewards, value_loss, whiten

# three completions of 4, 2 and 5 tokens (the last cut at the length limit: no padding)
LENGTHS = [4, 2, 5]


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1.0] * n + [0.0] * (5 - n) for n in LENGTHS])
    values = torch.randn(3, 5, generator=g)
    kl = torch.randn(3, 5, generator=g).abs()
    scores = torch.tensor([1.0, -0.5, 2.0])
    return mask, values, kl, scores


def direct_advantages(rewards, values, n, gamma, lam):
    """A_t = Σ_k (γλ)^k δ_{t+k}, δ_t = r_t + γ V_{t+1} − V_t with V_n = 0, by the double sum."""
    v = values[:n].tolist() + [0.0]
    delta = [rewards[t] + gamma * v[t + 1] - v[t] for t in range(n)]
    return [sum((gamma * lam) ** k * delta[t + k] for k in range(n - t)) for t in range(n)]


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 1.0), (1.0, 1.0), (0.99, 0.0)])
def test_gae_and_returns_equal_the_direct_sums(gamma, lam):
    mask, values, kl, scores = batch()
    rewards = token_rewards(scores, kl, mask, kl_coef=0.1)
    advantages, returns = gae(rewards, values, mask, gamma, lam)
    for i, n in enumerate(LENGTHS):
        r = [-0.1 * kl[i, t].item() + (scores[i].item() if t == n - 1 else 0.0) for t in range(n)]
        assert rewards[i, :n].tolist() == pytest.approx(r, abs=1e-6)
        expected = direct_advantages(r, values[i], n, gamma, lam)
        assert advantages[i, :n].tolist() == pytest.approx(expected, abs=1e-5)
        assert returns[i, :n].tolist() == pytest.approx([a + values[i, t].item() for t, a in enumerate(expected)],
                                                        abs=1e-5)
        assert advantages[i, n:].abs().sum() == 0 and returns[i, n:].abs().sum() == 0  # padding stays out


def test_padding_values_do_not_leak_into_the_last_token():
    mask, values, kl, scores = batch()
    rewards = token_rewards(scores, kl, mask, kl_coef=0.0)
    noisy = values.clone()
    noisy[mask == 0] = 100.0  # whatever a critic says after the end
    assert torch.equal(gae(rewards, noisy, mask, 1.0, 0.95)[0], gae(rewards, values, mask, 1.0, 0.95)[0])


def test_whitening_uses_the_masked_mean_and_unbiased_std():
    mask, values, _, _ = batch()
    picked = values[mask.bool()]
    mean, std = picked.mean().item(), picked.std().item()  # torch.std is Bessel-corrected
    stats = moments([values[:2], values[2:]], [mask[:2], mask[2:]])  # micro-batches add up
    out = whiten(values, mask, stats)
    assert out[mask.bool()].tolist() == pytest.approx(((picked - mean) / math.sqrt(std ** 2 + 1e-8)).tolist(), abs=1e-5)
    assert out[mask == 0].abs().sum() == 0
    kept = whiten(values, mask, stats, shift_mean=False)
    assert kept[mask.bool()].tolist() == pytest.approx(((picked - mean) / std + mean).tolist(), abs=1e-5)


def test_value_loss_is_half_the_larger_squared_error_with_clipping():
    mask, old, _, _ = batch(1)
    g = torch.Generator().manual_seed(2)
    new = old + 0.5 * torch.randn(3, 5, generator=g)
    returns = torch.randn(3, 5, generator=g)
    c = 0.2
    terms, clipped = value_loss(new, old, returns, mask, cliprange_value=c)
    loss = divide(terms, batch_counts({"loss_mask": mask}))
    per_token, flags = [], []
    for i, n in enumerate(LENGTHS):
        for t in range(n):
            v, v_old, ret = new[i, t].item(), old[i, t].item(), returns[i, t].item()
            v_clip = v_old + min(max(v - v_old, -c), c)
            per_token.append(0.5 * max((v - ret) ** 2, (v_clip - ret) ** 2))
            flags.append((v_clip - ret) ** 2 > (v - ret) ** 2)
    assert loss.item() == pytest.approx(sum(per_token) / len(per_token), rel=1e-5)
    assert clipped[mask.bool()].tolist() == flags
    assert 0 < sum(flags) < len(flags)  # both branches are exercised
    # aggregated like the policy loss: per sequence, then over sequences
    per_seq, _ = value_loss(new, old, returns, mask, cliprange_value=c, aggregate=per_sequence_mean)
    per_seq = divide(per_seq, batch_counts({"loss_mask": mask}))
    means, start = [], 0
    for n in LENGTHS:
        means.append(sum(per_token[start:start + n]) / n)
        start += n
    assert per_seq.item() == pytest.approx(sum(means) / 3, rel=1e-5)


def test_kl_controller_follows_its_update_rule():
    fixed = KLController(0.05)
    fixed.update(10.0, 64)
    assert fixed.value == 0.05
    ctl = KLController(0.1, target=6.0, horizon=10000)
    expected = 0.1
    for kl in [3.0, 6.6, 12.0, 0.0, 7.2]:
        ctl.update(kl, 256)
        expected *= 1 + min(max(kl / 6.0 - 1, -0.2), 0.2) * 256 / 10000
        assert ctl.value == pytest.approx(expected, rel=1e-12)
    restored = KLController(0.1, target=6.0)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value


def test_a_completion_without_tokens_gets_no_score():
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    rewards = token_rewards(torch.tensor([1.0, 5.0]), torch.zeros(2, 2), mask, kl_coef=0.1)
    assert rewards.tolist() == [[0.0, 1.0], [0.0, 0.0]]


@pytest.mark.parametrize("layer", ["plain", "caught"])
@pytest.mark.parametrize("group", [1, 3])
def test_a_shared_value_head_reads_the_policys_last_hidden_states(tiny, monkeypatch, layer, group):
    """`--critic_backbone shared` takes its input from the loss's own forward: with a plain output
    layer (hidden states returned; each group's prompt run once) or any other (caught on its way
    into the output layer), the states equal transformers' last hidden states at the positions that
    predict each completion token, and the log-probs are unchanged."""
    from transformers import AutoModelForCausalLM

    import swift.trainers.completion_logps as completion_logps

    model = AutoModelForCausalLM.from_config(tiny[0].config).eval()
    if layer == "caught":
        monkeypatch.setattr(completion_logps, "plain_head", lambda m: None)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 2000, (2, 5), generator=g).repeat_interleave(3, 0)
    prompt_mask = torch.ones_like(prompt)
    prompt_mask[:3, :2] = 0  # left padding
    completion = torch.randint(3, 2000, (6, 4), generator=g)
    completion_mask = torch.ones_like(completion)
    completion_mask[1, 2:] = 0  # right padding
    batch = {"prompt_ids": prompt, "prompt_mask": prompt_mask, "completion_ids": completion,
             "completion_mask": completion_mask}
    with torch.no_grad():
        logps, _, hidden = completion_logps.token_logps(model, batch, 1.0, False, group, with_hidden=True)
        plain_logps, _ = completion_logps.token_logps(model, batch, 1.0, False, 1)
        ids, mask = torch.cat([prompt, completion], 1), torch.cat([prompt_mask, completion_mask], 1)
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                    output_hidden_states=True)
    expected = out.hidden_states[-1][:, 4:8]
    real = completion_mask.bool()
    torch.testing.assert_close(hidden[real], expected[real], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logps[real], plain_logps[real], rtol=1e-4, atol=1e-4)

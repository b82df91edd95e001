"""Dense process rewards (`--prm_model`): the steps found in a completion, the PRM's score of each
equal to its probability at the positions its training labelled, process advantages by hand, and
GRPO and PPO training with them."""
import json
import types

import pytest
import torch

from swift.rewards.process import ProcessRewardModel, process_advantages
from swift.utils.registry import SwiftError
from tests.conftest import train_argv


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
    """A process reward model as `--rlhf_type prm` saves one (an untrained head: the test compares
    two ways of reading the same model, not its quality)."""
    from swift.model import load_model

    path = tmp_path_factory.mktemp("prm")
    model, tokenizer, _ = load_model("builtin:tiny-chat", task_type="token_cls")
    torch.nn.init.normal_(model.score.weight, std=0.05)  # scores that differ from step to step
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_steps_end_at_separators_and_the_last_step_at_its_last_token(prm_dir, tokenizer):
    prm = ProcessRewardModel(prm_dir, tokenizer, "\n")
    ids = tokenizer.encode("12+34=46\n46+05=51", add_special_tokens=False)
    content, ends, open_tail = prm.step_ends(ids + [tokenizer.eos_token_id, tokenizer.pad_token_id])
    assert content == ids and open_tail
    assert ends == [ids.index(prm.separator[0]), len(ids) - 1]
    _, ends, open_tail = prm.step_ends(ids + prm.separator)
    assert not open_tail and len(ends) == 2 and ends[-1] == len(ids)


def test_step_scores_are_the_prm_probabilities_at_its_training_labels(prm_dir, tokenizer):
    """The PRM reads the policy's tokens (with a separator appended to an unfinished last step) as
    `swift rlhf --rlhf_type prm` encoded its training rows: the scores equal the probability of
    'correct' at the labelled positions of `encode_steps` for the same steps."""
    from transformers import AutoModelForTokenClassification

    from swift.pipelines.rlhf import encode_steps
    from swift.template import get_template, infer_template
    from swift.template.base import IGNORE_INDEX

    template = get_template(infer_template("qwen2", tokenizer), tokenizer)
    messages = [{"role": "user", "content": "12+34+05="}]
    steps = ["12+34=46", "46+05=51"]
    row = encode_steps(template, {"messages": messages, "completions": steps, "labels": [True, True]},
                       types.SimpleNamespace(step_separator="\n", max_length=None))
    ids, targets = row["sequences"][0]
    model = AutoModelForTokenClassification.from_pretrained(prm_dir).eval()
    with torch.no_grad():
        probs = model(input_ids=torch.tensor([ids])).logits[0].softmax(-1)[:, 1]
    expected = [probs[i].item() for i, t in enumerate(targets) if t != IGNORE_INDEX]

    prm = ProcessRewardModel(prm_dir, tokenizer, "\n")
    completion = tokenizer.encode("\n".join(steps), add_special_tokens=False) + [tokenizer.eos_token_id]
    (scored,) = prm.score([template.encode_prompt(messages)], [completion])
    assert [r for _, r in scored] == pytest.approx(expected, abs=1e-6)
    assert len({round(r, 4) for _, r in scored}) == 2


def test_process_advantages_by_hand():
    # one group of two completions: steps (end index, reward)
    steps = [[(1, 0.9), (3, 0.2)], [(2, 0.5)]]
    out = process_advantages(steps, num_generations=2, width=5)
    r = torch.tensor([0.9, 0.2, 0.5])
    z = (r - r.mean()) / (r.std() + 1e-4)
    expected = torch.zeros(2, 5)
    expected[0, :2] += z[0]
    expected[0, :4] += z[1]
    expected[1, :3] += z[2]
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("rlhf_type", ["grpo", "ppo"])
def test_process_rewards_reach_training_where_the_formulas_place_them(tmp_path, prm_dir, rlhf_type, monkeypatch):
    """Through the trainer: GRPO's advantages are the outcome advantage plus `process_advantages` of
    the PRM's step scores; PPO's returns are GAE over the per-token rewards with each step's score on
    its last token (β 0, no outcome reward: the step scores are the only reward)."""
    from swift.pipelines.rlhf import rlhf_main
    from swift.rlhf.ppo import gae
    from swift.trainers.rollout import Rollout

    seen = []
    rollout_cls = Rollout
    if rlhf_type == "ppo":
        from swift.trainers.ppo import PPORollout

        rollout_cls = PPORollout
    original = rollout_cls.assign_advantages

    def spy(self, micro, rewards, trajectories, steps=None):
        out = original(self, micro, rewards, trajectories, steps)
        seen.append(([dict(b) for b in micro], rewards.clone(), steps, out))
        return out

    monkeypatch.setattr(rollout_cls, "assign_advantages", spy)
    extra = ["--num_generations", "4"] if rlhf_type == "grpo" else ["--num_ppo_epochs", "1"]
    rlhf_main(train_argv(tmp_path, "--rlhf_type", rlhf_type, "--dataset", "builtin:arith-steps#16", "--tuner_type",
                         "full", "--prm_model", prm_dir, "--per_device_train_batch_size", "8", "--beta", "0",
                         "--max_completion_length", "8", "--temperature", "1.0", "--max_steps", "1", *extra))
    (micro,), rewards, steps, sequence_advantages = seen[0]
    assert all(len(row) >= 1 for row in steps) and torch.equal(rewards, torch.zeros(8))
    width = micro["completion_ids"].size(1)
    if rlhf_type == "grpo":
        expected = sequence_advantages[:, None] + process_advantages(steps, 4, width)
        torch.testing.assert_close(micro["advantages"], expected)
        assert micro["advantages"].abs().sum() > 0
    else:
        mask = micro["completion_mask"].float()
        token_reward = torch.zeros(8, width)
        for i, row in enumerate(steps):
            for end, r in row:
                token_reward[i, end] += r
        _, returns = gae(token_reward, micro["values"], mask, 1.0, 0.95)
        torch.testing.assert_close(micro["returns"], returns, rtol=1e-5, atol=1e-5)
    with open(tmp_path / "logging.jsonl") as f:
        log = next(json.loads(line) for line in f if '"loss"' in line)
    assert log["rewards/prm/steps"] >= 1 and 0 < log["rewards/prm/mean"] < 1


def test_prm_model_is_refused_outside_online_rl(tmp_path, prm_dir):
    from swift.pipelines.rlhf import rlhf_main

    with pytest.raises(SwiftError, match="--prm_model does nothing for --rlhf_type dpo; it is read by --rlhf_type grpo, ppo"):
        rlhf_main(train_argv(tmp_path, "--rlhf_type", "dpo", "--dataset", "builtin:arith-dpo#8", "--prm_model", prm_dir))

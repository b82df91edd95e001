"""DPO losses against TRL's DPOTrainer (the oracle) on the same tiny model and batch."""
import copy

import pytest
import torch
from datasets import Dataset

from swift.model import load_model
from swift.rlhf.dpo import DPO_LOSSES, dpo_loss

PAIRS = [("07+45=", "52", "25"), ("10+10=", "20", "1"), ("99+1=", "100", "991"), ("3+4=", "7", "34")]


@pytest.fixture(scope="module")
def models():
    policy, tokenizer, _ = load_model("builtin:tiny-chat")
    ref = copy.deepcopy(policy)
    with torch.no_grad():  # a reference that differs from the policy, so the log-ratios are not zero
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return policy, ref, tokenizer


def trl_batch_and_loss(policy, ref, tokenizer, loss_type, beta, tmp_path, label_smoothing=0.0):
    from trl import DPOConfig, DPOTrainer

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p}],
                               "chosen": [{"role": "assistant", "content": c}],
                               "rejected": [{"role": "assistant", "content": r}]} for p, c, r in PAIRS])
    config = DPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=len(PAIRS), beta=beta,
                       loss_type=[loss_type], label_smoothing=label_smoothing, report_to="none", use_cpu=True,
                       bf16=False, max_length=None, dataloader_pin_memory=False)
    trainer = DPOTrainer(model=policy, ref_model=ref, args=config, train_dataset=data, processing_class=tokenizer)
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, batch)
    return batch, loss


@pytest.mark.parametrize("loss_type,label_smoothing", [("sigmoid", 0.0), ("ipo", 0.0), ("hinge", 0.0), ("robust", 0.0),
                                                      ("robust", 0.1)])
def test_loss_equals_trl(models, loss_type, label_smoothing, tmp_path):
    """Through our trainer's own `compute_loss` (the policy's chunked forward, the positions it
    keeps, the reference model it loaded from --ref_model, the step reducer) on TRL's batch, against
    TRL's `compute_loss`. With ε = 0 robust equals sigmoid; ε = 0.1 tests robust's own formula.
    (Sigmoid with ε is cDPO, as ms-swift has it; TRL 1.16's sigmoid ignores ε, so it is checked
    against hand-computed values below.)"""
    from swift.pipelines.base import resolve_args
    from swift.pipelines.rlhf import RLHFArguments, RLHFPipeline

    policy, ref, tokenizer = models
    for name, model in (("policy", policy), ("ref", ref)):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    batch, expected = trl_batch_and_loss(policy, ref, tokenizer, loss_type, 0.1, tmp_path / "trl", label_smoothing)
    ours = RLHFPipeline(resolve_args(RLHFArguments, [
        "--model", str(tmp_path / "policy"), "--ref_model", str(tmp_path / "ref"), "--rlhf_type", "dpo",
        "--tuner_type", "full", "--dataset", "builtin:arith-dpo#4", "--output_dir", str(tmp_path / "ours"),
        "--loss_type", loss_type, "--beta", "0.1", "--label_smoothing", str(label_smoothing), "--report_to", "none"],
        "swift rlhf")).build_trainer()
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "labels": labels}
    ours.model.eval()
    with torch.no_grad():
        loss = ours.compute_loss(ours.model, inputs)
    metrics = {key: values[-1] for key, values in ours._metrics["eval"].items()}
    assert abs(loss.item() - expected.item()) < 1e-5
    assert metrics["rewards/margins"] != 0  # the reference differs from the policy


def test_every_loss_type_is_finite_and_prefers_the_chosen():
    c = torch.tensor([2.0, 0.5])
    r = torch.tensor([-1.0, 0.4])
    n = torch.tensor([3, 3])
    for name in DPO_LOSSES:
        better = DPO_LOSSES.get(name)(c, r, beta=0.5, label_smoothing=0.0, chosen_len=n, rejected_len=n)
        worse = DPO_LOSSES.get(name)(r, c, beta=0.5, label_smoothing=0.0, chosen_len=n, rejected_len=n)
        assert torch.isfinite(better).all() and better.mean() < worse.mean(), name


def test_cdpo_label_smoothing_and_weights():
    c, r = torch.tensor([1.0]), torch.tensor([0.0])
    plain = dpo_loss(c, r, 0 * c, 0 * r, loss_types=["sigmoid"], loss_weights=None, beta=1.0)
    smoothed = dpo_loss(c, r, 0 * c, 0 * r, loss_types=["sigmoid"], loss_weights=None, beta=1.0, label_smoothing=0.1)
    expected = -0.9 * torch.nn.functional.logsigmoid(torch.tensor(1.0)) - 0.1 * torch.nn.functional.logsigmoid(
        torch.tensor(-1.0))
    assert smoothed.item() == pytest.approx(expected.item()) and smoothed > plain
    mixed = dpo_loss(c, r, 0 * c, 0 * r, loss_types=["sigmoid", "hinge"], loss_weights=[1.0, 0.5], beta=1.0)
    assert mixed.item() == pytest.approx(plain.item() + 0.5 * max(0.0, 1 - 1.0))

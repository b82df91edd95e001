"""ORPO, CPO, SimPO, KTO, reward-model and GKD losses against TRL 1.16 (the oracle): TRL builds the
batch and computes its loss; our algorithm's loss (the same function the trainer calls), divided by
the batch's counts as the trainer's step reducer does (`swift.rlhf.reduce`), runs on the same
tensors and must agree within 1e-5."""
import copy
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset

from swift.model import load_model
from swift.rlhf import ALGORITHMS
from swift.rlhf.reduce import batch_counts, divide

PAIRS = [("07+45=", "52", "25"), ("10+10=", "20", "1"), ("99+1=", "100", "991"), ("3+4=", "7", "34")]
CPU = dict(report_to="none", use_cpu=True, bf16=False, dataloader_pin_memory=False)


def perturbed(model, scale=0.05):
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn_like(p))
    return other


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    policy, tokenizer, _ = load_model("builtin:tiny-chat")
    return perturbed(policy, 0.02), perturbed(policy), tokenizer  # policy and reference differ


def pair_data(margins=False):
    return Dataset.from_list([{"prompt": [{"role": "user", "content": p}],
                               "chosen": [{"role": "assistant", "content": c}],
                               "rejected": [{"role": "assistant", "content": r}],
                               **({"margin": 0.5 * i} if margins else {})} for i, (p, c, r) in enumerate(PAIRS)])


def logps(model, input_ids, attention_mask, labels):
    from swift.trainers.rlhf import forward_logps

    return forward_logps(model, {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}, None,
                         whole_sequence=True)


def concat(a: torch.Tensor, b: torch.Tensor, pad) -> torch.Tensor:
    width = max(a.size(1), b.size(1))
    return torch.cat([torch.nn.functional.pad(x, (0, width - x.size(1)), value=pad) for x in (a, b)])


def reduced(terms, batch: dict) -> torch.Tensor:
    """The loss of `batch` taken as one optimizer step: what the trainer's reducer makes of the terms."""
    return divide(terms, batch_counts(batch))


def args(rlhf_type, **overrides):
    from swift.arguments.rlhf import RlhfArguments

    teacher = {"teacher_model": "t"} if rlhf_type == "gkd" else {}
    return SimpleNamespace(**{**vars(RlhfArguments(rlhf_type=rlhf_type, **teacher)), **overrides})


@pytest.mark.parametrize("rlhf_type, trl_kwargs, ours", [
    ("orpo", {"beta": 0.1}, {}),
    ("cpo", {"beta": 0.1, "cpo_alpha": 1.0, "loss_type": "sigmoid", "label_smoothing": 0.1}, {"label_smoothing": 0.1}),
    ("simpo", {"beta": 2.0, "cpo_alpha": 0.5, "loss_type": "simpo", "simpo_gamma": 1.0}, {"cpo_alpha": 0.5}),
])
def test_reference_free_pair_losses_equal_trl(models, tmp_path, rlhf_type, trl_kwargs, ours):
    policy, _, tokenizer = models
    if rlhf_type == "orpo":
        from trl.experimental.orpo import ORPOConfig as Config, ORPOTrainer as Trainer
    else:
        from trl.experimental.cpo import CPOConfig as Config, CPOTrainer as Trainer
    config = Config(output_dir=str(tmp_path), per_device_train_batch_size=len(PAIRS), **trl_kwargs, **CPU)
    trainer = Trainer(model=policy, args=config, train_dataset=pair_data(), processing_class=tokenizer)
    batch = next(iter(trainer.get_train_dataloader()))
    pad = tokenizer.pad_token_id
    with torch.no_grad():
        expected = trainer.compute_loss(trainer.model, batch)
        ours_batch = {"input_ids": concat(batch["chosen_input_ids"], batch["rejected_input_ids"], pad),
                      "attention_mask": concat(batch["chosen_attention_mask"], batch["rejected_attention_mask"], 0),
                      "labels": concat(batch["chosen_labels"], batch["rejected_labels"], -100)}
        out = logps(policy, **ours_batch)
        terms, metrics = ALGORITHMS[rlhf_type].loss(out, None, {}, args(rlhf_type, **ours))
        loss = reduced(terms, ours_batch)
    assert abs(loss.item() - expected.item()) < 1e-5
    assert metrics["rewards/accuracies"] == pytest.approx(trainer._stored_metrics["train"]["rewards/accuracies"][-1])


def test_kto_loss_equals_trl(models, tmp_path):
    from trl import KTOConfig, KTOTrainer

    policy, ref, tokenizer = models
    rows = [(p, c if i % 2 == 0 else r, i % 2 == 0) for i, (p, c, r) in enumerate(PAIRS)]
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p}],
                               "completion": [{"role": "assistant", "content": c}], "label": label}
                              for p, c, label in rows])
    config = KTOConfig(output_dir=str(tmp_path), per_device_train_batch_size=len(rows), beta=0.1,
                       desirable_weight=1.0, undesirable_weight=1.5, **CPU)
    trainer = KTOTrainer(model=policy, ref_model=ref, args=config, train_dataset=data, processing_class=tokenizer)
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        expected = trainer.compute_loss(trainer.model, batch)
        ids = torch.cat([batch["input_ids"], batch["KL_input_ids"]])
        mask = torch.cat([batch["attention_mask"], batch["KL_attention_mask"]])
        labels = ids.masked_fill(torch.cat([batch["completion_mask"], batch["KL_completion_mask"]]) == 0, -100)
        terms, metrics = ALGORITHMS["kto"].loss(logps(policy, ids, mask, labels), logps(ref, ids, mask, labels),
                                                {"label": batch["label"]}, args("kto", undesirable_weight=1.5))
        loss = reduced(terms, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    assert abs(loss.item() - expected.item()) < 1e-5
    assert metrics["kl"] == pytest.approx(trainer._metrics["train"]["kl"][-1], abs=1e-6)


@pytest.mark.parametrize("margins, center", [(False, None), (True, 0.01)])
def test_reward_model_loss_equals_trl(tmp_path, margins, center):
    from trl import RewardConfig, RewardTrainer

    torch.manual_seed(0)
    model, tokenizer, _ = load_model("builtin:tiny-chat", task_type="seq_cls")
    config = RewardConfig(output_dir=str(tmp_path), per_device_train_batch_size=len(PAIRS),
                          center_rewards_coefficient=center, **CPU)
    trainer = RewardTrainer(model=model, args=config, train_dataset=pair_data(margins), processing_class=tokenizer)
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        expected = trainer.compute_loss(trainer.model, dict(batch))
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        terms, metrics = ALGORITHMS["rm"].loss(logits, batch, args("rm", center_rewards_coefficient=center))
        loss = reduced(terms, {"input_ids": batch["input_ids"]})
    assert abs(loss.item() - expected.item()) < 1e-5
    assert metrics["accuracy"] == pytest.approx(trainer._metrics["train"]["accuracy"][-1])


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9, 1.0])
def test_gkd_generalized_jsd_equals_trl(models, tokenizer, beta):
    from trl.experimental.gkd import GKDTrainer

    from swift.pipelines.rlhf import SequenceCollator, encode_conversation
    from swift.rlhf.logps import labelled_positions
    from swift.template import get_template

    student, teacher, _ = models
    template = get_template("chatml", tokenizer, loss_scale="last_round")
    rows = [{"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": c}]} for p, c, _ in PAIRS]
    batch = SequenceCollator(tokenizer.pad_token_id)([encode_conversation(template, r) for r in rows])
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    with torch.no_grad():
        s, t = student(input_ids=ids, attention_mask=mask).logits, teacher(input_ids=ids, attention_mask=mask).logits
        expected = GKDTrainer.generalized_jsd_loss(s[:, :-1], t[:, :-1], labels=labels[:, 1:], beta=beta)
        keep = labelled_positions(labels)  # what the trainer does: logits only at labelled positions
        targets = labels[:, 1:][:, keep]
        sel = targets != -100
        terms, _ = ALGORITHMS["gkd"].loss(s[:, keep][sel], t[:, keep][sel], args("gkd", beta=beta))
        loss = reduced(terms, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    assert abs(loss.item() - expected.item()) < 1e-5

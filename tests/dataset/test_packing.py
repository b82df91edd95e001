import torch

from swift.dataset.encode import Collator, pack
from swift.dataset.loader import load_rows
from swift.template import IGNORE_INDEX, get_template
from swift.trainers.trainer import causal_lm_loss


def per_sample_losses(model, batch, seq_lens=None):
    """Summed next-token loss of each sample, read off one (possibly packed) row."""
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0].float()
    labels = batch["labels"][0]
    token_loss = torch.nn.functional.cross_entropy(logits[:-1], labels[1:], ignore_index=IGNORE_INDEX, reduction="none")
    bounds = torch.tensor([0, *seq_lens]).cumsum(0)
    return [token_loss[s:e - 1].sum().item() for s, e in zip(bounds[:-1], bounds[1:])]


def test_packed_loss_equals_unpacked(tiny):
    model, tokenizer, _ = tiny
    model.eval()
    template = get_template("chatml", tokenizer, loss_scale="all")
    rows = load_rows(["builtin:arith-sft#6"]).rows + [{"text": "a longer raw text sample, 123+456=579"}]
    samples = [{"input_ids": e.input_ids, "labels": e.labels} for e in map(template.encode, rows)]
    packed = pack(samples, max_length=512)
    assert len(packed) == 1
    collate = Collator(tokenizer.pad_token_id)
    by_len = {}
    for s in samples:
        alone = collate([s])
        by_len.setdefault(len(s["input_ids"]), []).append(per_sample_losses(model, alone, [len(s["input_ids"])])[0])
    got = per_sample_losses(model, collate(packed), packed[0]["seq_lens"])
    order = packed[0]["seq_lens"]
    for n, loss in zip(order, got):
        match = min(by_len[n], key=lambda x: abs(x - loss))
        assert abs(match - loss) < 1e-4
        by_len[n].remove(match)


def test_packed_rows_respect_max_length():
    samples = [{"input_ids": [1] * n, "labels": [1] * n} for n in (5, 9, 3, 7, 2, 8)]
    packed = pack(samples, max_length=10)
    assert all(sum(p["seq_lens"]) <= 10 for p in packed)
    assert sorted(n for p in packed for n in p["seq_lens"]) == [2, 3, 5, 7, 8, 9]
    assert all(p["labels"][0] == IGNORE_INDEX for p in packed)


def test_label_only_loss_equals_full_logits_loss(tiny):
    model, tokenizer, _ = tiny
    template = get_template("chatml", tokenizer)
    rows = load_rows(["builtin:arith-sft#4"]).rows
    batch = Collator(tokenizer.pad_token_id)([{"input_ids": e.input_ids, "labels": e.labels} for e in map(template.encode, rows)])
    with torch.no_grad():
        ours = causal_lm_loss(model, batch, None)
        reference = model(**batch).loss
    assert torch.allclose(ours, reference, atol=1e-5)

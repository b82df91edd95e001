import json

import pytest
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
    # through the training loss: the packed row's summed loss is the samples' own, token for token
    # (a sample's first token predicted from the one before it would add a term here)
    with torch.no_grad():
        whole = causal_lm_loss(model, collate(packed), 1).item()
        alone = sum(causal_lm_loss(model, collate([s]), 1).item() for s in samples)
    labelled = lambda batch: (batch["labels"][:, 1:] != IGNORE_INDEX).sum().item()  # noqa: E731
    assert labelled(collate(packed)) == sum(labelled(collate([s])) for s in samples)
    assert whole == pytest.approx(alone, rel=1e-5)


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


@pytest.mark.parametrize("rlhf_type", [None, "dpo", "kto"])
def test_dataset_num_proc_encodes_the_same_rows_in_parallel(tmp_path, rlhf_type):
    """--dataset_num_proc 2 (forked workers) gives exactly the samples and the dropped-row report of
    one process, through the pipelines' own encode (sft; the rlhf pair and unpaired encoders)."""
    from swift.dataset.loader import load_rows
    from swift.pipelines.base import resolve_args

    if rlhf_type is None:
        from swift.arguments import SftArguments as Args
        from swift.pipelines.train import TrainPipeline as Pipeline
        data, extra = "builtin:arith-sft#200", []
    else:
        from swift.arguments.rlhf import RLHFArguments as Args
        from swift.pipelines.rlhf import RLHFPipeline as Pipeline
        data, extra = "builtin:arith-dpo#200", ["--rlhf_type", rlhf_type]
    rows = tmp_path / "rows.jsonl"
    good = load_rows([data]).rows
    broken = [{"messages": [{"role": "user", "content": "x"}], "rejected_response": "y"}] * 3  # no answer
    rows.write_text("".join(json.dumps(r) + "\n" for r in good[:60] + broken + good[60:]))
    if rlhf_type == "kto":
        rows.write_text("".join(json.dumps({**r, "label": i % 2 == 0}) + "\n" for i, r in enumerate(good)))
    out = []
    for procs in ("1", "2"):
        a = resolve_args(Args, ["--model", "builtin:tiny-chat", "--dataset", str(rows), "--dataset_num_proc", procs,
                                "--output_dir", str(tmp_path), *extra], "swift")
        pipeline = Pipeline(a)
        _, _, template, _ = pipeline.load()
        rowset = load_rows([str(rows)], shuffle=False)
        samples = pipeline.encode(rowset, template, "encode")
        out.append((samples, dict(rowset.dropped)))
    assert out[0] == out[1] and len(out[0][0]) >= 100


def test_lazy_tokenize_encodes_rows_when_training_reaches_them(tmp_path):
    """--lazy_tokenize: nothing is encoded up front; each item equals the eager encoding of its row;
    a bad row gives way to the next one (or stops the run with --strict); a DPO run trains on it."""
    from swift.arguments import SftArguments
    from swift.dataset.encode import LazyDataset
    from swift.pipelines.rlhf import rlhf_main
    from swift.pipelines.train import TrainPipeline
    from swift.utils.registry import SwiftError
    from tests.conftest import train_argv

    rows = load_rows(["builtin:arith-sft#20"]).rows
    data = tmp_path / "rows.jsonl"
    bad = {"messages": [{"role": "user", "content": "no answer"}]}
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:5] + [bad] + rows[5:]))
    common = dict(model="builtin:tiny-chat", dataset=[str(data)], output_dir=str(tmp_path), dataset_shuffle=False)
    eager_pipeline = TrainPipeline(SftArguments(**common))
    _, _, template, _ = eager_pipeline.load()
    eager, _, _ = eager_pipeline.datasets(template)
    lazy, _, _ = TrainPipeline(SftArguments(**common, lazy_tokenize=True)).datasets(template)
    assert isinstance(lazy, LazyDataset) and len(lazy) == 21 and len(eager) == 20
    items = [lazy[i] for i in range(21)]
    assert items[:5] + items[6:] == [eager[i] for i in range(20)] and items[5] == eager[5]  # row 6 gave way
    strict, _, _ = TrainPipeline(SftArguments(**common, lazy_tokenize=True, strict=True)).datasets(template)
    with pytest.raises(SwiftError, match="rows.jsonl row 6"):
        strict[5]
    result = rlhf_main(train_argv(tmp_path / "dpo", "--rlhf_type", "dpo", "--dataset", "builtin:arith-dpo#16",
                                  "--lazy_tokenize", "true", "--max_steps", "2"))
    assert result["global_step"] == 2


def test_padding_free_trains_like_padded_batches(tmp_path):
    """`--padding_free`: the same samples and loss per step as padded batches (SGD, 3 steps, mixed
    lengths), through `swift sft`'s own collator and trainer."""
    from safetensors.torch import load_file

    from swift.pipelines.train import sft_main
    from tests.conftest import train_argv

    def run(out, *extra):
        sft_main(train_argv(out, "--tuner_type", "full", "--optim", "sgd", "--learning_rate", "0.5", "--max_steps",
                            "3", "--lr_scheduler_type", "constant", "--dataset", "builtin:arith-sft#16",
                            "builtin:self-cognition#16", *extra))
        with open(out / "logging.jsonl") as f:
            losses = [r["loss"] for r in map(json.loads, f) if "loss" in r]
        return losses, load_file(out / "model.safetensors")

    padded_losses, padded = run(tmp_path / "padded")
    free_losses, free = run(tmp_path / "free", "--padding_free", "true")
    assert free_losses == pytest.approx(padded_losses, rel=1e-5)
    for name in padded:
        torch.testing.assert_close(free[name], padded[name], rtol=1e-5, atol=1e-5, msg=name)


def test_padding_free_batches_are_one_row_without_padding(tiny):
    from swift.arguments import SftArguments
    from swift.pipelines.base import resolve_args
    from swift.pipelines.train import TrainPipeline

    model, tokenizer, _ = tiny
    args = resolve_args(SftArguments, ["--model", "builtin:tiny-chat", "--dataset", "x", "--padding_free", "true"],
                        "swift sft")
    collate = TrainPipeline(args).collator(tokenizer, model)
    samples = [{"input_ids": [5] * n, "labels": [5] * n} for n in (3, 7, 4)]
    batch = collate(samples)
    assert batch["input_ids"].shape == (1, 14) and batch["attention_mask"].shape == (1, 1, 14, 14)
    assert batch["position_ids"][0].tolist() == [0, 1, 2, *range(7), 0, 1, 2, 3]

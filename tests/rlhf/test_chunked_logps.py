"""Log-probs over the vocabulary in chunks of positions (hidden states in, never the whole logits)
equal the plain path on the logits: values, entropies and gradients, within 1e-5, through the
functions the trainers call (`forward_logps` for preference losses, `token_logps` for GRPO,
`causal_lm_loss` for sft/pt)."""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import swift.rlhf.logps as logps
from swift.rlhf.reduce import batch_counts, divide
from swift.trainers.completion_logps import token_logps
from swift.trainers.rlhf import forward_logps
from swift.trainers.trainer import causal_lm_loss


def both_ways(monkeypatch, fn):
    """fn() with the plain logits path, then with the chunked one in chunks of 3 positions."""
    with monkeypatch.context() as m:
        m.setattr(logps, "PLAIN_HEAD_MODEL_TYPES", set())
        plain = fn()
    with monkeypatch.context() as m:
        m.setattr(logps, "CHUNK_ELEMENTS", 3 * 2048)
        chunked = fn()
    return plain, chunked


@pytest.fixture
def model(tiny):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny[0].config).float()


def labelled_batch(seed: int, rows: int, length: int, prompt: int, pad_from: int) -> dict:
    """Random ids, row 1 right-padded from `pad_from`, the first `prompt` positions unlabelled."""
    ids = torch.randint(3, 2000, (rows, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, pad_from:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :prompt] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def grads(model):
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return out


@pytest.mark.parametrize("whole_sequence", [False, True])
def test_preference_log_probs(monkeypatch, model, whole_sequence):
    batch = labelled_batch(1, rows=4, length=12, prompt=5, pad_from=9)
    keep = logps.labelled_positions(batch["labels"])

    def run():
        out = forward_logps(model, batch, keep, whole_sequence)
        total = out.sums.sum() + (out.all_sums.sum() if whole_sequence else 0)
        total.backward()
        return out, grads(model)

    (plain, g1), (chunked, g2) = both_ways(monkeypatch, run)
    torch.testing.assert_close(chunked.sums, plain.sums, rtol=1e-5, atol=1e-5)
    assert torch.equal(chunked.lengths, plain.lengths)
    if whole_sequence:
        torch.testing.assert_close(chunked.all_sums, plain.all_sums, rtol=1e-5, atol=1e-5)
    for name in g1:
        torch.testing.assert_close(g2[name], g1[name], rtol=1e-5, atol=1e-5, msg=name)


def test_sft_loss(monkeypatch, model):
    """sft's loss (what `SwiftTrainer.compute_loss` returns) in chunks of 3 positions equals the
    plain path and the model's own loss, with padding, a prompt, a row without any label, and a
    token count given from outside the micro-batch (gradient accumulation)."""
    batch = labelled_batch(4, rows=3, length=11, prompt=4, pad_from=8)
    labels = batch["labels"]
    labels[2] = -100  # a row that carries no loss
    g = torch.Generator().manual_seed(4)

    calls = []
    fused = logps._SummedCrossEntropy.apply
    monkeypatch.setattr(logps._SummedCrossEntropy, "apply", lambda *a: calls.append(1) or fused(*a))

    def run(count):
        loss = causal_lm_loss(model, batch, count)
        loss.backward()
        return loss.detach(), grads(model)

    # full tuning of a tied output layer; one that does not train (LoRA); an untied one with a bias
    for case in ("tied", "frozen", "untied with bias"):
        model.lm_head.weight.requires_grad_(case != "frozen")
        if case == "untied with bias":
            model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
            model.lm_head.bias = torch.nn.Parameter(0.1 * torch.randn(model.lm_head.out_features, generator=g))
        for count in (None, torch.tensor(40)):
            (l1, g1), (l2, g2) = both_ways(monkeypatch, lambda: run(count))
            assert len(calls) == 1  # the chunked run took its gradients in the forward pass
            calls.clear()
            torch.testing.assert_close(l2, l1, rtol=1e-5, atol=1e-6)
            assert g1.keys() == g2.keys() and ("lm_head.bias" in g1) == (case == "untied with bias")
            for name in g1:
                torch.testing.assert_close(g2[name], g1[name], rtol=1e-5, atol=1e-6, msg=name)
    causal_lm_loss(model, batch, None)
    assert not calls  # logits that fit in one chunk (the default's 2^26 elements) are computed whole
    with torch.no_grad():
        reference = model(**batch).loss * (labels[:, 1:] != -100).sum() / 40
        _, unchanged = both_ways(monkeypatch, lambda: causal_lm_loss(model, batch, torch.tensor(40)))  # evaluation
    torch.testing.assert_close(l2, reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(unchanged, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["bf16 weights", "bf16 autocast", "fp16 autocast"])
def test_sft_loss_in_half_precision(monkeypatch, model, mode):
    """The same in bf16 (weights, or fp32 weights under autocast) and under fp16 autocast, where
    both paths round: the chunked one's loss and gradients are as far from fp32's as the plain
    path's are, and the chunked path is the one that ran — in fp16 the one that recomputes each
    chunk in the backward pass (the forward pass cannot apply a loss scale it does not know)."""
    import swift.trainers.trainer as trainer_module

    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 2000, (3, 11), generator=g)
    labels = ids.clone()
    labels[:, :4] = -100
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    calls, fused_calls = [], []
    chunked_loss, fused = trainer_module.head_cross_entropy, logps._SummedCrossEntropy.apply
    monkeypatch.setattr(trainer_module, "head_cross_entropy", lambda *a: calls.append(1) or chunked_loss(*a))
    monkeypatch.setattr(logps._SummedCrossEntropy, "apply", lambda *a: fused_calls.append(1) or fused(*a))

    def run(half=True):
        dtype = torch.float16 if mode.startswith("fp16") else torch.bfloat16
        with torch.autocast("cpu", dtype=dtype, enabled=half and mode.endswith("autocast")):
            loss = causal_lm_loss(model, batch, None)
        loss.backward()
        out = {n: p.grad.float().clone() for n, p in model.named_parameters()}
        model.zero_grad()
        return loss.detach().float(), out

    with monkeypatch.context() as m:
        m.setattr(logps, "PLAIN_HEAD_MODEL_TYPES", set())
        l0, g0 = run(half=False)  # fp32, plain
    if mode == "bf16 weights":
        model.to(torch.bfloat16)
    (l1, g1), (l2, g2) = both_ways(monkeypatch, run)
    assert len(calls) == 1  # the chunked path ran once (and the plain one did not call it)
    assert len(fused_calls) == (0 if mode.startswith("fp16") else 1)
    assert abs(l2 - l0) <= 2 * abs(l1 - l0) + 1e-3
    for name in g0:
        plain_error, chunked_error = (g1[name] - g0[name]).norm(), (g2[name] - g0[name]).norm()
        assert chunked_error <= 1.5 * plain_error + 1e-3 * g0[name].norm(), name


@pytest.mark.parametrize("group_size", [1, 2])
def test_grpo_token_log_probs_and_entropies(monkeypatch, model, group_size):
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, 2000, (2, 5), generator=g).repeat_interleave(2, dim=0)
    prompt_mask = torch.ones_like(prompt)
    prompt_mask[2:, :2] = 0  # left padding
    completion = torch.randint(3, 2000, (4, 7), generator=g)
    completion_mask = torch.ones_like(completion)
    completion_mask[3, 4:] = 0
    batch = {"prompt_ids": prompt, "prompt_mask": prompt_mask, "completion_ids": completion,
             "completion_mask": completion_mask}

    def run():
        lp, ent = token_logps(model, batch, temperature=0.7, with_entropy=True, group_size=group_size)
        (lp * completion_mask).sum().backward()
        return lp.detach(), ent, grads(model)

    (lp1, e1, g1), (lp2, e2, g2) = both_ways(monkeypatch, run)
    torch.testing.assert_close(lp2, lp1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(e2, e1, rtol=1e-5, atol=1e-5)
    for name in g1:
        torch.testing.assert_close(g2[name], g1[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("sft_alpha", ["0", "0.5"])
def test_gkd_loss_through_the_trainer(monkeypatch, tiny_dir, tmp_path, sft_alpha):
    """GKD's JSD (and its SFT term) from hidden states in chunks equals the plain path on the whole
    logits, through `DistillTrainer.loss_and_metrics` on a batch of its own collator (and the step
    reducer, the batch being its whole step)."""
    from swift.pipelines.base import resolve_args
    from swift.pipelines.rlhf import RLHFArguments, RLHFPipeline

    teacher = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    teacher.save_pretrained(tmp_path / "teacher")
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(tmp_path / "teacher")
    trainer = RLHFPipeline(resolve_args(RLHFArguments, [
        "--model", tiny_dir, "--rlhf_type", "gkd", "--teacher_model", str(tmp_path / "teacher"), "--tuner_type",
        "full", "--dataset", "builtin:arith-sft#8", "--output_dir", str(tmp_path / "out"), "--beta", "0.3",
        "--sft_alpha", sft_alpha, "--per_device_train_batch_size", "4", "--report_to", "none"],
        "swift rlhf")).build_trainer()
    batch = next(iter(trainer.get_train_dataloader()))

    def run():
        terms, metrics = trainer.loss_and_metrics(trainer.model, batch)
        loss = divide(terms, batch_counts(batch))
        loss.backward()
        return loss.detach(), metrics, grads(trainer.model)

    (l1, m1, g1), (l2, m2, g2) = both_ways(monkeypatch, run)
    torch.testing.assert_close(l2, l1, rtol=1e-5, atol=1e-6)
    assert abs(m2["jsd"] - m1["jsd"]) < 1e-5 and ("sft_loss" in m1) == (sft_alpha != "0")
    for name in g1:
        torch.testing.assert_close(g2[name], g1[name], rtol=1e-5, atol=1e-6, msg=name)


def test_where_the_output_layer_is_chunked(model):
    """`plain_head` (what README and docs/benchmarks.md say): the qwen2 model's head on one rank; None
    for an unlisted model type, a split weight (ZeRO-3's ds_id, FSDP's DTensor), and DDP with an untied
    output layer that trains; the head again under DDP when it is tied to the input embeddings."""
    import copy
    import types

    assert logps.plain_head(model) is model.lm_head
    other = copy.deepcopy(model)
    other.config.model_type = "gemma2"  # soft-caps its logits
    assert logps.plain_head(other) is None
    split = copy.deepcopy(model)
    split.lm_head.weight.ds_id = 7
    assert logps.plain_head(split) is None
    from torch.distributed.fsdp import FullyShardedDataParallel
    assert logps.plain_head(FullyShardedDataParallel.__new__(FullyShardedDataParallel)) is None  # FSDP1's wrapper
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    untied = copy.deepcopy(model)
    if tied:
        untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    assert logps.plain_head(types.SimpleNamespace(module=untied)) is None  # a DDP wrapper's .module
    untied.lm_head.weight.requires_grad_(False)
    assert logps.plain_head(types.SimpleNamespace(module=untied)) is untied.lm_head

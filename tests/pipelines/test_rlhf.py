"""`swift rlhf --rlhf_type dpo` end to end on the built-in model."""
import copy
import json
import os

import pytest
import torch

from swift.dataset.loader import load_rows
from swift.pipelines.rlhf import SequenceCollator, encode_pair, rlhf_main
from swift.template import IGNORE_INDEX, get_template
from swift.utils.registry import SwiftError
from tests.conftest import train_argv


def read_log(out):
    with open(os.path.join(out, "logging.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_pair_encoding_and_collation(tokenizer):
    template = get_template("chatml", tokenizer, loss_scale="last_round")
    row = load_rows(["builtin:arith-dpo#1"]).rows[0]
    pair = encode_pair(template, row)
    (_, chosen_labels), (_, rejected_labels) = pair["sequences"]
    chosen = [t for t in chosen_labels if t != IGNORE_INDEX]
    rejected = [t for t in rejected_labels if t != IGNORE_INDEX]
    assert tokenizer.decode(chosen) == row["messages"][-1]["content"] + "<|im_end|>"
    assert tokenizer.decode(rejected) == row["rejected_response"] + "<|im_end|>"
    batch = SequenceCollator(tokenizer.pad_token_id)([pair, pair])
    assert batch["input_ids"].shape[0] == 4 and torch.equal(batch["input_ids"][0], batch["input_ids"][1])


@pytest.mark.parametrize("tuner", ["lora", "full"])
def test_dpo_learns_a_small_preference_set(tmp_path, tuner):
    out = tmp_path / tuner
    lr = "5e-3" if tuner == "lora" else "1e-3"
    result = rlhf_main(train_argv(out, "--dataset", "builtin:arith-dpo#16", "--tuner_type", tuner,
                                  "--learning_rate", lr, "--max_steps", "30", "--per_device_train_batch_size", "8",
                                  "--beta", "0.5", "--rpo_alpha", "0.1"))
    logs = [r for r in read_log(out) if "loss" in r]
    assert logs[-1]["rewards/accuracies"] == 1.0 and logs[-1]["rewards/margins"] > logs[0]["rewards/margins"]
    assert sum(r["loss"] for r in logs[-5:]) / 5 < logs[0]["loss"] - 0.2
    assert result["global_step"] == 30


def test_lora_reference_is_the_policy_without_adapters(tmp_path):
    """At step 0 the implicit rewards are exactly zero: the reference is the same weights with adapters off."""
    out = tmp_path / "zero"
    rlhf_main(train_argv(out, "--dataset", "builtin:arith-dpo#8", "--max_steps", "1",
                         "--per_device_train_batch_size", "8", "--learning_rate", "1e-9"))
    first = read_log(out)[0]
    assert first["rewards/chosen"] == pytest.approx(0.0, abs=1e-6) and first["loss"] == pytest.approx(0.6931, abs=1e-3)


def test_rows_without_rejected_are_reported(tmp_path):
    with pytest.raises(SwiftError, match="no rejected response"):
        rlhf_main(train_argv(tmp_path, "--dataset", "builtin:arith-sft#4", "--strict", "true"))
    with pytest.raises(SwiftError, match="--loss_type|unknown DPO loss type 'sigmod'"):
        rlhf_main(train_argv(tmp_path, "--dataset", "builtin:arith-dpo#4", "--loss_type", "sigmod"))


def test_ref_adapters_make_the_reference_the_adapted_model(tmp_path):
    """`--ref_adapters A` with `--adapters A`: the reference is the base model with A merged, so the
    first step's implicit rewards are zero; without it (the reference is the base model) they are not."""
    from swift.pipelines.train import sft_main

    adapter = tmp_path / "sft"
    sft_main(train_argv(adapter, "--learning_rate", "1e-2", "--max_steps", "4", "--dataset", "builtin:arith-sft#16"))
    common = ["--dataset", "builtin:arith-dpo#8", "--max_steps", "1", "--per_device_train_batch_size", "8",
              "--adapters", str(adapter)]
    rlhf_main(train_argv(tmp_path / "with", *common, "--ref_adapters", str(adapter)))
    rlhf_main(train_argv(tmp_path / "without", *common))
    with_ref, without = read_log(tmp_path / "with")[0], read_log(tmp_path / "without")[0]
    assert with_ref["rewards/chosen"] == pytest.approx(0.0, abs=1e-5)
    assert abs(without["rewards/chosen"]) > 1e-3


@pytest.mark.parametrize("rlhf_type", ["dpo", "grpo"])
def test_full_training_in_bf16_mixed_precision(tmp_path, rlhf_type):
    """bf16 weights with bf16 mixed precision (what a GPU run gets): the model's forward hands the
    hidden states back in fp32 and the chunked output layer must still project them (a dtype
    mismatch, found on an H100 by scripts/gpu_check.sh). On CPU, bf16 autocast runs the same path."""
    data = ["--dataset", "builtin:arith-dpo#8"] if rlhf_type == "dpo" else \
        ["--dataset", "builtin:arith-sft#8", "--reward_funcs", "accuracy", "--max_completion_length", "8",
         "--num_generations", "4"]
    from swift.pipelines.base import resolve_args
    from swift.pipelines.rlhf import RLHFArguments, RLHFPipeline

    argv = train_argv(tmp_path, "--rlhf_type", rlhf_type, *data, "--tuner_type", "full", "--torch_dtype",
                      "bfloat16", "--max_steps", "2")
    # the flag reaches the accelerator (it did not: bf16 weights trained without autocast)
    trainer = RLHFPipeline(resolve_args(RLHFArguments, argv, "swift rlhf")).build_trainer()
    assert trainer.accelerator.mixed_precision == "bf16"
    if hasattr(trainer, "close"):
        trainer.close()
    rlhf_main(argv)
    logs = [r for r in read_log(tmp_path) if "loss" in r]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in logs)
    if rlhf_type == "dpo":  # the frozen reference (autocast like the policy) agrees with it at step 1
        assert logs[0]["rewards/chosen"] == 0 and logs[0]["rewards/rejected"] == 0


def test_adapters_reference_is_the_base_through_the_adapter_switch(tmp_path, tiny):
    """`--adapters A` with LoRA: no second copy of the model; the reference's log-probs are the base
    model's (the policy with A disabled), and the log says so and how to make it the adapted model.
    (It was a deep copy of the bare base made before A loaded: a second model in memory.)"""
    import logging

    from peft import LoraConfig, get_peft_model

    from swift.pipelines.base import resolve_args
    from swift.pipelines.rlhf import RLHFArguments, RLHFPipeline
    from swift.rlhf.logps import labelled_positions
    from swift.trainers.rlhf import forward_logps

    model, tokenizer, _ = tiny
    base = copy.deepcopy(model)
    adapted = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, target_modules="all-linear",
                                                              init_lora_weights=False))
    adapted.save_pretrained(tmp_path / "adapter")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("swift").addHandler(handler)
    try:
        trainer = RLHFPipeline(resolve_args(RLHFArguments, [
            "--model", "builtin:tiny-chat", "--rlhf_type", "dpo", "--dataset", "builtin:arith-dpo#4",
            "--adapters", str(tmp_path / "adapter"), "--output_dir", str(tmp_path / "out"), "--report_to", "none"],
            "swift rlhf")).build_trainer()
    finally:
        logging.getLogger("swift").removeHandler(handler)
    assert trainer.ref_model is None
    assert any("--ref_adapters" in r.getMessage() and "base without --adapters" in r.getMessage() for r in records)
    batch = next(iter(trainer.get_train_dataloader()))
    keep = labelled_positions(batch["labels"])
    trainer.model.eval()
    with torch.no_grad():
        ref = trainer._reference_logps(batch, keep).sums
        policy = forward_logps(trainer.model, batch, keep).sums
        expected = forward_logps(base.eval(), batch, keep).sums
    torch.testing.assert_close(ref, expected, rtol=1e-5, atol=1e-5)
    assert (policy - ref).abs().max() > 1e-3  # the adapter is on in the policy

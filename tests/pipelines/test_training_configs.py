"""Everyday configurations the defaults do not exercise: LoRA with on-policy distillation,
multi-turn budgets, the token that really ended generation, and the like."""
import json
import math
import os

import pytest
import torch

from swift.model import load_model
from swift.pipelines.base import resolve_args
from swift.pipelines.rlhf import RLHFArguments, RLHFPipeline
from tests.conftest import train_argv


def logs_of(out):
    with open(os.path.join(out, "logging.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r]


def test_gkd_on_policy_with_lora_trains_only_the_adapters(tmp_path, tiny_dir):
    """`--lmbda 1` with the default tuner: every step samples from the student through the inference
    engine, which must neither freeze the adapters nor sample from the base model alone."""
    pipeline = RLHFPipeline(resolve_args(RLHFArguments, train_argv(
        tmp_path, "--rlhf_type", "gkd", "--teacher_model", tiny_dir, "--lmbda", "1", "--max_steps", "4",
        "--learning_rate", "1e-2", "--max_completion_length", "6", "--lora_rank", "4"), "swift rlhf"))
    pipeline.run()
    logs = logs_of(tmp_path)
    assert len(logs) == 4 and all(r["on_policy"] == 1.0 and math.isfinite(r["loss"]) for r in logs)
    model = pipeline.trainer.accelerator.unwrap_model(pipeline.trainer.model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)  # the trainable set is what the tuner made it
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert any(p.abs().max() > 0 for p in lora_b)  # zero at the start: the adapters trained
    base = dict(load_model("builtin:tiny-chat")[0].named_parameters())
    for name, p in model.named_parameters():
        if "lora_" not in name:
            key = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            torch.testing.assert_close(p.detach(), base[key].detach(), rtol=0, atol=0, msg=name)


def test_lora_weight_sync_never_writes_the_base_weights(tiny):
    """200 syncs of a bf16 LoRA policy (what the rollout client and the colocated vLLM engine send):
    the base weights stay bit-identical, and what is sent equals PEFT's own merge."""
    import copy

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from swift.rollout.client import sync_state_dict

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny[0].config).to(torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    for _ in range(200):
        sent = dict(sync_state_dict(model))
    for name, p in model.named_parameters():
        if "lora_" not in name:
            assert torch.equal(p, base[name]), name
    merged = copy.deepcopy(model).merge_and_unload().state_dict()
    assert sent.keys() == merged.keys()
    for name, tensor in merged.items():
        torch.testing.assert_close(sent[name], tensor, rtol=0, atol=0, msg=name)


def test_ms_swift_lora_variants_train_and_are_saved(tmp_path):
    """ms-swift's LoRA flags reach PEFT: rsLoRA scaling, regex targets, modules trained in full,
    trained biases and a separate adapter dtype in one run; DoRA with random B in another. Each
    trains (finite loss) and its adapter_config.json and weights say what was used."""
    from peft import PeftModel

    from swift import sft_main

    out = tmp_path / "variants"
    result = sft_main(train_argv(out, "--use_rslora", "true", "--target_regex", r".*\.(q_proj|v_proj)",
                                 "--modules_to_save", "norm", "--lora_bias", "all", "--lora_dtype", "bfloat16",
                                 "--learning_rate", "1e-2"))
    config = json.load(open(out / "adapter_config.json"))
    assert config["use_rslora"] and config["target_modules"] == r".*\.(q_proj|v_proj)"
    assert config["modules_to_save"] == ["norm"] and config["bias"] == "all"
    assert math.isfinite(result["metrics"]["train_loss"])
    from safetensors.torch import load_file

    saved = load_file(out / "adapter_model.safetensors")
    assert all(t.dtype == torch.bfloat16 for k, t in saved.items() if "lora_" in k)
    base, _, _ = load_model("builtin:tiny-chat")
    model = PeftModel.from_pretrained(base, out)
    names = [n for n, _ in model.named_parameters() if "lora_A" in n]
    assert names and all(".q_proj." in n or ".v_proj." in n for n in names)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert abs(layer.scaling["default"] - 32 / math.sqrt(8)) < 1e-9  # alpha / sqrt(r), not alpha / r
    assert any("modules_to_save" in n for n, _ in model.named_parameters())

    out = tmp_path / "dora"
    result = sft_main(train_argv(out, "--use_dora", "true", "--init_weights", "false", "--learning_rate", "1e-2"))
    config = json.load(open(out / "adapter_config.json"))
    assert config["use_dora"] and config["init_lora_weights"] is False
    assert math.isfinite(result["metrics"]["train_loss"])
    model = PeftModel.from_pretrained(load_model("builtin:tiny-chat")[0], out)
    assert any("lora_magnitude_vector" in n for n, _ in model.named_parameters())


def test_gkd_seq_kd_trains_on_the_teachers_greedy_answers(tmp_path):
    """`--seq_kd`: the batch the student trains on holds the teacher's own answers (greedy here,
    `--temperature 0`), sampled when the trainer prepares the step's micro-batches, not the dataset's."""
    from swift.model import load_model as load

    teacher_dir = tmp_path / "teacher"  # a teacher that answers differently from the student
    teacher, tokenizer, _ = load("builtin:tiny-chat")
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.5)
    teacher.save_pretrained(teacher_dir)
    tokenizer.save_pretrained(teacher_dir)
    pipeline = RLHFPipeline(resolve_args(RLHFArguments, train_argv(
        tmp_path / "out", "--rlhf_type", "gkd", "--teacher_model", str(teacher_dir), "--seq_kd", "true",
        "--lmbda", "0", "--temperature", "0", "--max_completion_length", "5", "--max_steps", "1"), "swift rlhf"))
    trainer = pipeline.build_trainer()
    seen = []
    trainer.loss_and_metrics = lambda model, inputs: (seen.append(inputs) or ({"rows": model(
        input_ids=inputs["input_ids"]).logits.sum() * 0}, {}))
    trainer.train()
    batch, teacher = seen[0], trainer.teacher
    for prompt, ids, labels in zip(batch["prompt_ids"], batch["input_ids"], batch["labels"]):
        answer = [t for t in labels.tolist() if t != -100]
        with torch.no_grad():
            greedy = teacher.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False)[0, len(prompt):]
        assert answer == greedy.tolist()[:len(answer)] and len(answer) > 0
    dataset_answers = {tuple(s["sequences"][0][1]) for s in trainer.train_dataset}
    assert not any(tuple(lab.tolist()) in dataset_answers for lab in batch["labels"])


def test_gkd_on_policy_answers_end_at_the_templates_end_of_turn_token(tmp_path):
    """A base model (EOS <|endoftext|>) distilled on chatml: the student's sampled answers end at
    <|im_end|>, where the dataset's answers end (before 2026-11-30 GKD's engine had no template and
    stopped at EOS only, so on-policy answers ran to --max_completion_length past the turn's end)."""
    model, tokenizer, _ = load_model("builtin:tiny-chat")
    tokenizer.eos_token = "<|endoftext|>"
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end != tokenizer.eos_token_id
    pipeline = RLHFPipeline(resolve_args(RLHFArguments, train_argv(
        tmp_path / "out", "--model", str(tmp_path / "base"), "--template", "chatml", "--rlhf_type", "gkd",
        "--teacher_model", str(tmp_path / "base"), "--lmbda", "1", "--max_completion_length", "8",
        "--max_steps", "1"), "swift rlhf"))
    trainer = pipeline.build_trainer()
    trainer.train()
    assert im_end in trainer._engines["student"].eos_ids


def test_qlora_trains_adapters_on_a_4bit_model(tmp_path):
    """`--quant_bits 4` (bitsandbytes, which runs on CPU too): the linear layers load as 4-bit NF4
    layers, LoRA trains on them and the loss falls; the base stays quantized and frozen; DPO on the
    same model runs with the adapter-off reference."""
    pytest.importorskip("bitsandbytes")
    import bitsandbytes as bnb

    from swift.pipelines.rlhf import rlhf_main
    from swift.pipelines.train import TrainPipeline
    from swift.arguments import SftArguments

    pipeline = TrainPipeline(resolve_args(SftArguments, train_argv(
        tmp_path / "sft", "--quant_bits", "4", "--max_steps", "12", "--learning_rate", "1e-2",
        "--per_device_train_batch_size", "8"), "swift sft"))
    pipeline.run()
    logs = logs_of(tmp_path / "sft")
    assert sum(r["loss"] for r in logs[-3:]) / 3 < logs[0]["loss"] - 0.5
    model = pipeline.trainer.accelerator.unwrap_model(pipeline.trainer.model)
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers and all(not p.requires_grad for m in layers for p in m.parameters(recurse=False))
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    assert os.path.isfile(tmp_path / "sft" / "adapter_model.safetensors")
    rlhf_main(train_argv(tmp_path / "dpo", "--rlhf_type", "dpo", "--dataset", "builtin:arith-dpo#8", "--quant_bits",
                         "4", "--max_steps", "2"))
    first = logs_of(tmp_path / "dpo")[0]
    assert first["rewards/chosen"] == pytest.approx(0.0, abs=1e-6)  # the reference: the same 4-bit base, adapter off


@pytest.mark.gpu
def test_liger_kernel_trains_on_a_gpu(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("liger_kernel")
    from swift.pipelines.train import sft_main

    sft_main(train_argv(tmp_path, "--use_liger_kernel", "true", "--max_steps", "2"))
    assert all(math.isfinite(r["loss"]) for r in logs_of(tmp_path))

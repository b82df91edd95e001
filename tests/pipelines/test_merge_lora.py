import re
import subprocess

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from swift import merge_lora_main, sft_main
from swift.model import load_model
from swift.utils.registry import SwiftError
from tests.conftest import SWIFT, train_argv


def test_merged_model_equals_base_plus_adapter(tmp_path):
    adapter = tmp_path / "lora"
    # a large learning rate so the adapter really moves the logits
    sft_main(train_argv(adapter, "--learning_rate", "5e-2", "--max_steps", "5"))
    result = merge_lora_main(["--adapters", str(adapter), "--output_dir", str(tmp_path / "merged")])
    assert result["base_model"] == "builtin:tiny-chat"
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    base, tokenizer, _ = load_model("builtin:tiny-chat")
    reference = PeftModel.from_pretrained(base, adapter).eval()
    ids = tokenizer(["12+34=46", "7+5=12"], return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = reference(**ids).logits
        got = merged(**ids).logits
        plain = load_model("builtin:tiny-chat")[0](**ids).logits
    assert (expected - plain).abs().max() > 1e-2  # the adapter changed something
    assert (got - expected).abs().max() < 1e-4


def test_cli_rejects_a_non_adapter_dir(tmp_path):
    out = subprocess.run([*SWIFT, "merge-lora", "--adapters", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert "no adapter_config.json there" in out.stderr.strip().splitlines()[-1]


def test_merge_keeps_the_checkpoint_dtype_of_the_base(tmp_path, tiny):
    """A base saved in bfloat16 merges to bfloat16 safetensors unless --torch_dtype says otherwise
    (`auto` elsewhere means float32 on a CPU; here it means the base checkpoint's dtype)."""
    import copy
    import json

    from peft import LoraConfig, get_peft_model
    from safetensors import safe_open

    model, tokenizer, _ = tiny
    base_dir, adapter_dir = tmp_path / "base-bf16", tmp_path / "lora"
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(0)  # init_lora_weights=False: B is random too, so the adapter changes the weights
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    peft_model.save_pretrained(adapter_dir)
    assert json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base_dir)

    def merged_dtypes(out, *flags):
        proc = subprocess.run([*SWIFT, "merge-lora", "--adapters", str(adapter_dir),
                               "--output_dir", str(out), *flags], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        with safe_open(str(out / "model.safetensors"), "pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        return {t.dtype for t in tensors.values()}, tensors, json.loads((out / "config.json").read_text())

    dtypes, tensors, config = merged_dtypes(tmp_path / "merged")
    assert dtypes == {torch.bfloat16} and config["dtype"] == "bfloat16"
    with safe_open(str(base_dir / "model.safetensors"), "pt") as f:
        name = "model.layers.0.self_attn.q_proj.weight"
        assert not torch.equal(tensors[name], f.get_tensor(name))  # the adapter was merged in
    # an explicit --torch_dtype still wins
    assert merged_dtypes(tmp_path / "merged-fp32", "--torch_dtype", "float32")[0] == {torch.float32}


def test_merged_reward_model_keeps_its_trained_value_head(tmp_path):
    """An `rm` LoRA adapter carries its value head (`score`); the merge loads the base with that head,
    so the merged model scores like base + adapter."""
    from transformers import AutoModelForSequenceClassification

    from swift.pipelines.rlhf import rlhf_main

    adapter = tmp_path / "rm"
    rlhf_main(["--rlhf_type", "rm", "--model", "builtin:tiny-chat", "--dataset", "builtin:arith-dpo#16",
               "--output_dir", str(adapter), "--add_version", "false", "--max_steps", "2", "--per_device_train_batch_size", "4",
               "--learning_rate", "5e-2", "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true"])
    merge_lora_main(["--adapters", str(adapter), "--output_dir", str(tmp_path / "merged")])
    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged").eval()
    base, tokenizer, _ = load_model("builtin:tiny-chat", task_type="seq_cls")
    reference = PeftModel.from_pretrained(base, adapter).eval()
    ids = tokenizer(["12+34=46", "7+5=13"], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert (merged(**ids).logits - reference(**ids).logits).abs().max() < 1e-4


def lora_adapter(directory, **config):
    """A LoRA adapter of the built-in model with random A and B (so merging it changes weights)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = load_model("builtin:tiny-chat", torch_dtype="float32")[0]
    get_peft_model(model, LoraConfig(r=4, init_lora_weights=False, **config)).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def q_proj_adapter(tmp_path_factory):
    return lora_adapter(tmp_path_factory.mktemp("adapter") / "lora", target_modules=["q_proj"])


@pytest.mark.parametrize("case,line", [
    ("not_empty", "is not empty \\(1 entries, e.g. model.safetensors\\); pass a new or empty directory"),
    ("a_file", "is a file; pass a new or empty directory"),
    ("foo", "^--torch_dtype 'foo' is not one of auto, float32, float16, bfloat16, float64"),
    ("int8", "^--torch_dtype 'int8' is not one of auto"),
])
def test_cli_refuses_an_output_dir_or_dtype_it_cannot_write_in_one_line(tmp_path, q_proj_adapter, case, line):
    """Before 2026-11-29 a non-empty --output_dir was written over (an earlier model, the base model's
    own directory), and a file there or an unknown --torch_dtype ended in a traceback."""
    adapter = q_proj_adapter
    out = tmp_path / "out"
    flags = ["--output_dir", str(out)]
    if case == "not_empty":
        out.mkdir()
        (out / "model.safetensors").write_text("an earlier model")
    elif case == "a_file":
        out.write_text("x")
    else:
        flags += ["--torch_dtype", case]
    proc = subprocess.run([*SWIFT, "merge-lora", "--adapters", str(adapter), "--model", "builtin:tiny-chat", *flags],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert re.search(line, proc.stderr.strip().splitlines()[-1].split("error: ", 1)[1])
    if case == "not_empty":
        assert (out / "model.safetensors").read_text() == "an earlier model"


def test_merge_into_the_consoles_run_directory_and_a_failed_save_leaves_nothing(tmp_path, q_proj_adapter, monkeypatch):
    """The web console's run directory (its swift_run.json and run.log) takes the merged model beside
    them; a save that fails leaves no half-written model (before 2026-11-29 the model's files stayed
    in --output_dir, without merge_args.json)."""
    import errno

    import swift.pipelines.merge_lora as M

    adapter = q_proj_adapter
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "swift_run.json").write_text("{}")
    (run_dir / "run.log").write_text("log")
    merge_lora_main(["--adapters", str(adapter), "--model", "builtin:tiny-chat", "--output_dir", str(run_dir)])
    assert {"swift_run.json", "run.log", "model.safetensors", "config.json", "merge_args.json"} <= set(
        p.name for p in run_dir.iterdir())
    assert (run_dir / "run.log").read_text() == "log"

    def full_disk(*_, **__):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(M, "write_json", full_disk)  # the last file of the save
    out = tmp_path / "merged"
    with pytest.raises(SwiftError, match=f"^--output_dir {out}: No space left on device \\(nothing was written "):
        merge_lora_main(["--adapters", str(adapter), "--model", "builtin:tiny-chat", "--output_dir", str(out)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no output, no staging left


@pytest.mark.parametrize("target,line", [
    ("embed_tokens", "LoRA on model.embed_tokens, whose matrix this model ties to its output layer"),
    ("lm_head", "LoRA on lm_head, whose matrix this model ties to its input embeddings"),
])
def test_merge_refuses_lora_on_a_tied_embedding_matrix(tmp_path, target, line):
    """The built-in model ties its input embeddings to its output layer: merging LoRA on either
    would change both (before 2026-11-29 the merged model's logits differed from base + adapter by
    ~1e3)."""
    adapter = lora_adapter(tmp_path / "lora", target_modules=[target, "q_proj"])
    with pytest.raises(SwiftError, match=f"^--adapters {adapter}: {line} \\(tie_word_embeddings\\)"):
        merge_lora_main(["--adapters", str(adapter), "--model", "builtin:tiny-chat",
                         "--output_dir", str(tmp_path / "merged")])
    assert not (tmp_path / "merged").exists()

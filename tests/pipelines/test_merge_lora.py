import subprocess
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from swift import merge_lora_main, sft_main
from swift.model import load_model
from tests.conftest import train_argv


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
    out = subprocess.run([sys.executable, "-m", "swift", "merge-lora", "--adapters", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert "no adapter_config.json there" in out.stderr.strip().splitlines()[-1]

"""`swift.tuners.prepare_model`: what --target_modules, --adapters and the freezing flags train (each
fixed 2026-11-30; the docstrings say what happened before)."""
import importlib.util
import json
import os

import pytest
import torch

from swift import SftArguments, sft_main
from swift.model import load_model
from swift.tuners import prepare_model
from swift.utils.registry import SwiftError
from tests.conftest import train_argv

BASE = {"model": "builtin:tiny-chat", "dataset": ["builtin:arith-sft#8"]}
LINEAR = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def save_adapter(path, seed: int) -> str:
    from peft import LoraConfig, get_peft_model

    model = load_model("builtin:tiny-chat", torch_dtype="float32")[0]
    torch.manual_seed(seed)
    get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False)).save_pretrained(path)
    return str(path)


def snapshot(folder) -> dict:
    """Each file's modification time and bytes."""
    out = {}
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = (os.stat(f.fileno()).st_mtime_ns, f.read())
    return out


def lora_modules(model) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}


def test_all_linear_among_other_names_is_expanded_as_in_ms_swift(tmp_path):
    """(before: `--target_modules all-linear embed_tokens` gave LoRA to embed_tokens alone, and
    `--target_modules all-embedding` stopped in a PEFT traceback)"""
    sft_main(train_argv(tmp_path, "--target_modules", "all-linear", "embed_tokens", "--max_steps", "1"))
    with open(tmp_path / "adapter_config.json") as f:
        assert set(json.load(f)["target_modules"]) == LINEAR | {"embed_tokens"}
    model = prepare_model(load_model("builtin:tiny-chat")[0],
                          SftArguments(**BASE, target_modules=["all-embedding", "q_proj"]).tuner_args)
    assert lora_modules(model) == {"embed_tokens", "q_proj"}
    model = prepare_model(load_model("builtin:tiny-chat", task_type="seq_cls")[0],
                          SftArguments(**BASE, task_type="seq_cls", target_modules=["all-linear", "all-embedding"]
                                       ).tuner_args, task_type="seq_cls")
    assert lora_modules(model) == LINEAR | {"embed_tokens"}  # the value head is trained whole, without LoRA


def test_a_second_adapter_is_refused_and_the_inputs_stay_untouched(tmp_path):
    """(before: the second --adapters path loaded untrained, and each save rewrote that input folder,
    its adapter name being its path)"""
    a, b = save_adapter(tmp_path / "A", 1), save_adapter(tmp_path / "B", 2)
    with pytest.raises(SwiftError, match=r"^--adapters: training continues one adapter, got 2; .*swift merge-lora"):
        sft_main(train_argv(tmp_path / "out", "--adapters", a, b))
    before = snapshot(a)
    sft_main(train_argv(tmp_path / "out", "--adapters", a, "--max_steps", "2", "--save_strategy", "steps",
                        "--save_steps", "1"))
    assert snapshot(a) == before
    assert os.path.isfile(tmp_path / "out" / "adapter_model.safetensors")


def test_freeze_ratio_counts_elements_as_in_ms_swift():
    """(before: the ratio counted tensors, so 0.5 froze 62.5% of the tiny model's elements; ms-swift
    freezes the first tensors whose running total of elements stays within the ratio: 48.4%)"""
    model = prepare_model(load_model("builtin:tiny-chat")[0],
                          SftArguments(**BASE, tuner_type="full", freeze_parameters_ratio=0.5).tuner_args)
    sizes = [p.numel() for p in model.parameters()]
    frozen = [not p.requires_grad for p in model.parameters()]
    n = frozen.index(False)
    assert not any(frozen[n:])  # a prefix of the model, from the bottom
    assert sum(sizes[:n]) <= sum(sizes) / 2 < sum(sizes[:n + 1])
    assert round(100 * sum(sizes[:n]) / sum(sizes), 1) == 48.4


@pytest.mark.parametrize("kwargs,message", [
    ({"freeze_parameters_ratio": 1.0}, "^--freeze_parameters / --freeze_parameters_ratio leave no parameter trainable"),
    ({"freeze_parameters": ["model"]}, "leave no parameter trainable"),
    ({"freeze_parameters": ["modle.layers"]}, "^--freeze_parameters modle.layers: no parameter name starts with it"),
    ({"trainable_parameters": ["model.layer.0"]}, "^--trainable_parameters model.layer.0: no parameter name starts"),
])
def test_freezing_that_leaves_nothing_or_names_nothing_is_refused(kwargs, message):
    """(before: a run with every parameter frozen trained nothing and exited 0; a prefix that matched
    no parameter name was accepted)"""
    args = SftArguments(**BASE, tuner_type="full", **kwargs).tuner_args
    with pytest.raises(SwiftError, match=message):
        prepare_model(load_model("builtin:tiny-chat")[0], args)


@pytest.mark.skipif(importlib.util.find_spec("gptqmodel") is None and importlib.util.find_spec("deepspeed") is None,
                    reason="neither gptqmodel nor deepspeed is installed")
def test_lora_training_imports_neither_gptqmodel_nor_deepspeed(tmp_path):
    """A LoRA `swift sft` and loading its adapter, in a fresh process with them installed (before: PEFT
    imported gptqmodel for every LoRA: ~2 s, its banner, and HF_HOME, HF_HUB_CACHE, TRANSFORMERS_CACHE and
    HF_MODULES_CACHE set to /tmp for every process started later; accelerate imported deepspeed when the
    trainer unwrapped its model: ~2 s and a warning). Then `swift export --quant_method gptq`'s import of
    gptqmodel leaves those variables unset. A GPTQ checkpoint still gets PEFT's GPTQ layers:
    tests/export/test_export.py; --deepspeed still runs: tests/pipelines/test_sharding.py."""
    import subprocess
    import sys

    from swift.utils.imports import GPTQMODEL_SETS

    script = ("import os, sys\n"
              "from swift import sft_main\n"
              "from swift.model import load_model\n"
              "from swift.tuners import PeftModel\n"
              "sft_main(sys.argv[1:])\n"
              "PeftModel.from_pretrained(load_model('builtin:tiny-chat')[0], %r)\n"
              "names = %r\n"
              "print('TRAINED', sorted(m for m in ('gptqmodel', 'deepspeed') if m in sys.modules), "
              "[k for k in names if k in os.environ])\n"
              "print('EXPORT', file=sys.stderr, flush=True)\n"
              "from swift.export.gptq import check_installed\n"
              "check_installed()\n"
              "print('EXPORTED', 'gptqmodel' in sys.modules, [k for k in names if k in os.environ])\n"
              % (str(tmp_path), GPTQMODEL_SETS))
    proc = subprocess.run([sys.executable, "-c", script, *train_argv(tmp_path, "--max_steps", "1", "--tuner_type", "lora")],
                          capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k not in GPTQMODEL_SETS})
    printed = [line for line in proc.stdout.splitlines() if line.startswith(("TRAINED", "EXPORTED"))]
    if importlib.util.find_spec("gptqmodel") is not None:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert printed == ["TRAINED [] []", "EXPORTED True []"], proc.stdout
    else:  # check_installed's one line ends it
        assert printed == ["TRAINED [] []"], (proc.stdout, proc.stderr[-3000:])
    training = proc.stderr.split("EXPORT")[0]
    assert "GPT-QModel" not in training and "Setting accelerator to CPU" not in training

"""Model and tuner flags that were accepted and ignored, or failed late in a traceback, refused in one
line when the arguments are parsed (each fixed 2026-11-30)."""
import pytest

from swift import SftArguments
from swift.model import load_model
from swift.utils.registry import SwiftError

BASE = {"model": "builtin:tiny-chat", "dataset": ["builtin:arith-sft#8"]}


@pytest.fixture
def adapter(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")  # all parsing reads of an adapter directory
    return str(tmp_path)


@pytest.mark.parametrize("kwargs,message", [
    ({"bnb_4bit_quant_type": "fp4"}, "^--bnb_4bit_quant_type is read only with --quant_bits 4"),
    ({"bnb_4bit_compute_dtype": "bfloat16"}, "^--bnb_4bit_compute_dtype is read only with --quant_bits 4"),
    ({"bnb_4bit_use_double_quant": False}, "^--bnb_4bit_use_double_quant is read only with --quant_bits 4"),
    ({"bnb_4bit_quant_storage": "bfloat16", "quant_bits": 8}, "^--bnb_4bit_quant_storage is read only with"),
    ({"quant_bits": 4, "bnb_4bit_compute_dtype": "uint8"}, "^--bnb_4bit_compute_dtype 'uint8' is not one of "
                                                           "float32, bfloat16, float16$"),
    ({"model_revision": "v1"}, "^--model_revision picks a revision of a hub id; --model builtin:tiny-chat is local"),
    ({"adapters": ["no/such/dir"]}, "^--adapters no/such/dir: no adapter_config.json there"),
])
def test_unread_or_invalid_model_flags_are_refused(kwargs, message):
    """(before: the bnb_4bit flags without --quant_bits 4 and --model_revision of a local model were
    ignored, a compute dtype of uint8 passed, and an --adapters folder without adapter_config.json
    failed in a ValueError traceback after the dataset was encoded)"""
    with pytest.raises(SwiftError, match=message):
        SftArguments(**BASE, **kwargs)


def test_model_revision_of_a_local_folder_is_refused(tmp_path):
    with pytest.raises(SwiftError, match=f"^--model_revision picks a revision of a hub id; --model {tmp_path} is"):
        SftArguments(**{**BASE, "model": str(tmp_path)}, model_revision="main")


def test_full_tuning_flags_with_adapters_are_refused(adapter):
    """(before: `--tuner_type full --freeze_parameters ... --adapters X` trained the adapter alone)"""
    for flag, value in (("freeze_parameters", ["model.layers.0"]), ("freeze_parameters_ratio", 0.5),
                        ("trainable_parameters", ["lm_head"])):
        with pytest.raises(SwiftError, match=f"^--{flag} shapes full tuning; with --adapters only the loaded"):
            SftArguments(**BASE, tuner_type="full", adapters=[adapter], **{flag: value})


def test_the_same_flags_where_they_are_read_pass(adapter):
    SftArguments(**BASE, quant_bits=4, bnb_4bit_quant_type="fp4", bnb_4bit_compute_dtype="bfloat16",
                 bnb_4bit_quant_storage="uint8", bnb_4bit_use_double_quant=False)
    SftArguments(**{**BASE, "model": "Qwen/Qwen2.5-0.5B"}, model_revision="master")  # parsing downloads nothing
    SftArguments(**BASE, adapters=[adapter])
    SftArguments(**BASE, tuner_type="full", freeze_parameters_ratio=0.5)


def test_flash_attention_3_without_its_package_is_one_line():
    """(before: only flash_attention_2 was checked; flash_attention_3 failed in transformers' traceback)"""
    with pytest.raises(SwiftError, match="^--attn_impl flash_attention_3 needs a CUDA GPU and the flash-attn-3 "):
        load_model("builtin:tiny-chat", attn_impl="flash_attention_3")

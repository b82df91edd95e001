"""Checks in PEFT and accelerate that import an installed library only to ask whether an object is one of
its classes: PEFT imports gptqmodel for every layer it adapts or loads an adapter into (about 2 s, a banner,
and its tokenicer setting HF_HOME, HF_HUB_CACHE, TRANSFORMERS_CACHE and HF_MODULES_CACHE to /tmp for every
process started afterwards), accelerate imports deepspeed each time a trainer unwraps its model (about
2 s and a warning line). No object is one of a library's classes before that library is imported (loading
a GPTQ checkpoint imports gptqmodel; `--deepspeed` imports deepspeed), so until then those checks answer
False without importing it."""
from __future__ import annotations

import contextlib
import os
import sys

# what gptqmodel's import sets where unset and this process's children must not inherit: its tokenicer
# the hub's caches (to /tmp), itself the GPUs' numbering (PCI_BUS_ID). Its CUDA allocator setting
# (PYTORCH_ALLOC_CONF, for its own memory use when it quantizes) stays.
GPTQMODEL_SETS = ("HF_HOME", "HF_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_MODULES_CACHE", "CUDA_DEVICE_ORDER")


def _until_imported(module, check_name: str, package: str) -> None:
    check = getattr(module, check_name, None)
    if check is None or getattr(check, "until_imported", None) == package:  # not there (another version), or done
        return

    def available() -> bool:
        return package in sys.modules and check()

    available.until_imported = package
    setattr(module, check_name, available)


def skip_unimported_libraries() -> None:
    """Each module below holds its own reference to its library's check (peft 0.21, accelerate 1.x)."""
    import accelerate.utils.other
    import peft.tuners.lora.awq
    import peft.tuners.lora.gptq
    import peft.utils.other
    import peft.utils.quantization_utils

    for module in (peft.tuners.lora.awq, peft.tuners.lora.gptq, peft.utils.other, peft.utils.quantization_utils):
        _until_imported(module, "is_gptqmodel_available", "gptqmodel")
    _until_imported(accelerate.utils.other, "is_deepspeed_available", "deepspeed")


@contextlib.contextmanager
def gptqmodel_environment_kept():
    """Around code that may import gptqmodel (loading or making a GPTQ checkpoint): the variables its
    import sets (`GPTQMODEL_SETS`) are put back as they were, so that this process's later children see
    the user's. The libraries that read the hub's caches at their import are imported first."""
    import huggingface_hub.constants  # noqa: F401

    with contextlib.suppress(ImportError):
        import datasets.config  # noqa: F401
    before = {name: os.environ.get(name) for name in GPTQMODEL_SETS}
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

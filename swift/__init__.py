"""swift: one CLI for the LLM post-training loop."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# bitsandbytes (imported by peft whenever it is installed) warns on every start on CPUs with
# AVX512-BF16 that an optional kernel from the hub is missing; it falls back to its own, and the
# warning would be the first line of every command's output.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

_LAZY = {
    "sft_main": "swift.pipelines.train",
    "pt_main": "swift.pipelines.train",
    "merge_lora_main": "swift.pipelines.merge_lora",
    "export_main": "swift.pipelines.export",
    "rlhf_main": "swift.pipelines.rlhf",
    "infer_main": "swift.pipelines.infer",
    "deploy_main": "swift.pipelines.deploy",
    "rollout_main": "swift.pipelines.rollout",
    "RLHFArguments": "swift.arguments.rlhf",
    "SftArguments": "swift.arguments",
    "PtArguments": "swift.arguments",
    "TrainArguments": "swift.arguments",
    "MergeLoraArguments": "swift.pipelines.merge_lora",
    "ExportArguments": "swift.arguments.export",
}

if TYPE_CHECKING:  # pragma: no cover
    from swift.arguments import PtArguments, SftArguments, TrainArguments  # noqa: F401
    from swift.arguments.export import ExportArguments  # noqa: F401
    from swift.pipelines.export import export_main  # noqa: F401
    from swift.pipelines.merge_lora import MergeLoraArguments, merge_lora_main  # noqa: F401
    from swift.pipelines.train import pt_main, sft_main  # noqa: F401


def __getattr__(name: str) -> Any:
    # Imports are lazy so `swift --help` answers without loading torch.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'swift' has no attribute '{name}'")


__all__ = list(_LAZY)

"""ms-swift's Python entry points, under the names its scripts import:

    from swift.llm import sft_main, TrainArguments
    sft_main(TrainArguments(model="builtin:tiny-chat", dataset=["builtin:arith-sft#64"], max_steps=5))

Each `*_main` also takes a list of command-line flags, as `swift <command>` does. Imports are lazy,
so importing this module loads no model code."""
from __future__ import annotations

from typing import Any

_LAZY = {
    # commands
    "pt_main": "swift.pipelines.train",
    "sft_main": "swift.pipelines.train",
    "rlhf_main": "swift.pipelines.rlhf",
    "infer_main": "swift.pipelines.infer",
    "deploy_main": "swift.pipelines.deploy",
    "rollout_main": "swift.pipelines.rollout",
    "merge_lora_main": "swift.pipelines.merge_lora",
    "eval_main": "swift.pipelines.eval",
    "sample_main": "swift.pipelines.sample",
    # their arguments (ms-swift's TrainArguments is the sft/pt one)
    "TrainArguments": "swift.arguments",
    "SftArguments": "swift.arguments",
    "PtArguments": "swift.arguments",
    "RLHFArguments": "swift.arguments.rlhf",
    "InferArguments": "swift.pipelines.infer",
    "DeployArguments": "swift.pipelines.deploy",
    "RolloutArguments": "swift.pipelines.rollout",
    "MergeLoraArguments": "swift.pipelines.merge_lora",
    "EvalArguments": "swift.pipelines.eval",
    "SamplingArguments": "swift.pipelines.sample",
    "SampleArguments": "swift.pipelines.sample",
    # inference
    "InferRequest": "swift.infer.protocol",
    "RequestConfig": "swift.infer.protocol",
    "TransformersEngine": "swift.infer.transformers_engine",
    "VllmEngine": "swift.infer.vllm_engine",
    # building blocks
    "get_template": "swift.template",
    "load_model": "swift.model",
    "load_rows": "swift.dataset.loader",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'swift.llm' has no attribute '{name}' (this version provides: "
                         f"{', '.join(sorted(_LAZY))}; ms-swift's PtEngine, get_model_tokenizer and load_dataset "
                         "have other signatures here: TransformersEngine, load_model, load_rows)")


__all__ = list(_LAZY)

"""Build an engine (or a reward scorer) from model / template / engine arguments."""
from __future__ import annotations

import torch
from transformers import AutoConfig

from swift.infer.reward import RewardScorer
from swift.infer.transformers_engine import TransformersEngine
from swift.infer.protocol import InferEngine
from swift.model import load_model, load_tokenizer, resolve_model_dir
from swift.model.loader import bnb_config, builtin_dir, check_model_files
from swift.pipelines.merge_lora import base_model_of
from swift.template import choose_template, get_template
from swift.utils.registry import SwiftError


def _model_id(args, adapters: dict[str, str]) -> str:
    """--model, or the base model the first adapter was trained on."""
    model_id = args.model or (base_model_of(next(iter(adapters.values()))) if adapters else None)
    if not model_id:
        raise SwiftError("--model is required (or --adapters, whose base model is then used)")
    return model_id


def load_for_serving(args, task_type: str = "causal_lm"):
    """Model (with its LoRA adapters), tokenizer, template and the adapters ({name: path})."""
    adapters = args.engine_args.named_adapters()
    model_id = _model_id(args, adapters)
    model, tokenizer, info = load_model(model_id, use_hf=args.use_hf, revision=args.model_revision,
                                        torch_dtype=args.torch_dtype, attn_impl=args.attn_impl, task_type=task_type,
                                        num_labels=args.num_labels,
                                        check_model=getattr(args, "check_model", False),
                                        quantization=bnb_config(args))
    if torch.cuda.is_available():
        model.to("cuda")
    for i, (name, path) in enumerate(adapters.items()):
        if i == 0:
            from swift.tuners import PeftModel  # imported only when there are adapters: it takes seconds

            model = PeftModel.from_pretrained(model, path, adapter_name=name)
        else:
            model.load_adapter(path, adapter_name=name)
    name = choose_template(args.template, getattr(args, "model_type", None), info.model_type, tokenizer)
    template = get_template(name, tokenizer, system=args.system, max_length=args.max_length)
    template.split_special_tokens = not getattr(args, "allow_control_tokens", True)  # servers: plain text
    return model, tokenizer, template, adapters


def build_engine(args) -> tuple[InferEngine, dict[str, str]]:
    """Return the generation engine (`--infer_backend`) and the adapters it holds ({name: path})."""
    if args.infer_backend == "vllm":
        engine, adapters = build_vllm_engine(args)
    else:
        model, tokenizer, template, adapters = load_for_serving(args)
        engine = TransformersEngine(model, tokenizer, template, max_batch_size=args.max_batch_size)
    engine.prompt_limit, engine.truncation = args.max_length, args.truncation_strategy
    return engine, adapters


def build_vllm_engine(args, **engine_kwargs) -> tuple[InferEngine, dict[str, str]]:
    """`engine_kwargs` go to VllmEngine (the rollout server adds its weight-sync extension)."""
    from swift.infer.vllm_engine import VllmEngine

    adapters = args.engine_args.named_adapters()
    model_id = _model_id(args, adapters)
    model_dir, builtin = resolve_model_dir(model_id, use_hf=args.use_hf, revision=args.model_revision)
    if getattr(args, "check_model", False) and not builtin:
        check_model_files(model_dir)
    tokenizer = load_tokenizer(model_dir)
    if getattr(args, "quant_bits", None):
        raise SwiftError("--quant_bits loads bitsandbytes layers for --infer_backend transformers; vLLM serves "
                         "quantized checkpoints of its own")
    if builtin:  # vLLM reads weights from disk: write the seeded built-in model out once
        model_dir = builtin_dir(model_id)
    model_type = AutoConfig.from_pretrained(model_dir).model_type
    name = choose_template(args.template, getattr(args, "model_type", None), model_type, tokenizer)
    template = get_template(name, tokenizer, system=args.system, max_length=args.max_length)
    template.split_special_tokens = not getattr(args, "allow_control_tokens", True)  # servers: plain text
    utilization = args.vllm_gpu_memory_utilization or (0.9 if torch.cuda.is_available() else 0.2)
    dtype = "auto" if args.torch_dtype == "auto" else args.torch_dtype
    engine = VllmEngine(model_dir, tokenizer, template, adapters=adapters, dtype=dtype,
                        max_model_len=args.vllm_max_model_len, gpu_memory_utilization=utilization,
                        max_batch_size=args.max_batch_size, enforce_eager=args.vllm_enforce_eager, **engine_kwargs)
    return engine, adapters


def build_scorer(args) -> RewardScorer:
    """A reward model (`--task_type seq_cls`) for the reward routes of `swift deploy`."""
    model, tokenizer, template, adapters = load_for_serving(args, task_type="seq_cls")
    if adapters:
        model = model.merge_and_unload()
    return RewardScorer(model, tokenizer, template, max_batch_size=args.max_batch_size,
                        max_length=args.max_length or getattr(model.config, "max_position_embeddings", 2048),
                        truncation=args.truncation_strategy)

"""Tuners: LoRA (peft) and full fine-tuning with optional freezing."""
from __future__ import annotations

import warnings

import torch
from peft import LoraConfig, PeftModel, TaskType, get_peft_model, prepare_model_for_kbit_training
from peft.utils.other import is_gptqmodel_quant_linear
from transformers import PreTrainedModel

from swift.utils.imports import skip_unimported_libraries
from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)
HEADS = ["score", "classifier"]  # the value heads of transformers' classification models
PEFT_TASK_TYPES = {"causal_lm": TaskType.CAUSAL_LM, "seq_cls": TaskType.SEQ_CLS, "token_cls": TaskType.TOKEN_CLS}
# PEFT looks for the base model's config at its name; the built-in model has no directory to look in.
warnings.filterwarnings("ignore", message="Could not find a config file in builtin:")

skip_unimported_libraries()  # PEFT checks for gptqmodel by importing it; accelerate for deepspeed


def prepare_model(model: PreTrainedModel, args, *, task_type: str = "causal_lm") -> PreTrainedModel:
    """Wrap or freeze `model` according to the tuner arguments (`tuner_type`, `lora_*`, `freeze_*`)."""
    if getattr(model, "is_quantized", False):  # QLoRA: norms and embeddings in fp32, inputs carrying grads
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if args.adapters:  # one (TunerArguments refuses more): training goes on from it
        model = PeftModel.from_pretrained(model, args.adapters[0], is_trainable=True)
    elif args.tuner_type == "lora":
        target = args.target_modules
        # the LoRA-variant flags may be absent from a caller's own argument object: PEFT's defaults then
        init = str(getattr(args, "init_weights", "true")).lower()
        config = LoraConfig(
            r=args.lora_rank,
            lora_alpha=args.lora_alpha,
            lora_dropout=args.lora_dropout,
            # a string is a regular expression PEFT full-matches against module names
            target_modules=getattr(args, "target_regex", None) or target_modules(model, target, task_type),
            task_type=PEFT_TASK_TYPES[task_type],  # seq_cls/token_cls also train and save the head
            modules_to_save=list(getattr(args, "modules_to_save", [])) or None,
            # a value head is trained whole (modules_to_save, by the task type), never given LoRA: PEFT's
            # all-linear leaves out a token classifier's head only by name for sequence classifiers
            exclude_modules=HEADS if task_type != "causal_lm" and target == ["all-linear"] else None,
            bias=getattr(args, "lora_bias", "none"),
            use_dora=getattr(args, "use_dora", False),
            use_rslora=getattr(args, "use_rslora", False),
            init_lora_weights={"true": True, "false": False}.get(init, init),
        )
        model = get_peft_model(model, config)
        if getattr(args, "lora_dtype", None):
            dtype = getattr(torch, getattr(args, "lora_dtype", None))
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.data = p.data.to(dtype)
    else:
        freeze(model, args.freeze_parameters, args.freeze_parameters_ratio, args.trainable_parameters)
    trainable = sum(_numel(p) for p in model.parameters() if p.requires_grad)
    total = sum(_numel(p) for p in model.parameters())
    if not trainable:
        raise SwiftError("--freeze_parameters / --freeze_parameters_ratio leave no parameter trainable; freeze less, "
                         "or name some with --trainable_parameters")
    logger.info(f"trainable parameters: {trainable:,} / {total:,} ({100 * trainable / max(total, 1):.2f}%)")
    return model


def _numel(p: torch.Tensor) -> int:
    return getattr(p, "ds_numel", None) or p.numel()  # ZeRO-3 leaves an empty tensor on each rank


def target_modules(model: PreTrainedModel, names: list[str], task_type: str) -> str | list[str]:
    """PEFT's target modules for `--target_modules`: `all-linear` (every linear layer but the output
    head and a value head) and `all-embedding` (the embedding layers) expanded to module names wherever
    they appear among other names, as ms-swift does (alone, all-linear is PEFT's own expansion)."""
    names = [names] if isinstance(names, str) else list(names)
    # PEFT's all-linear finds no layer of a GPTQ checkpoint (gptqmodel's quantized layers are not
    # torch's Linear), though PEFT adapts them when named (QLoRA on GPTQ, as in ms-swift)
    quantized = any(is_gptqmodel_quant_linear(m) for m in model.modules())
    if names == ["all-linear"] and not quantized:
        return "all-linear"
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    linear, embedding, full_names = [], [], []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        is_linear = isinstance(module, (torch.nn.Linear, Conv1D)) or is_gptqmodel_quant_linear(module)
        if is_linear and module is not head and leaf not in HEADS:
            linear.append(leaf)
            full_names.append(name)
        elif isinstance(module, torch.nn.Embedding):
            embedding.append(leaf)
    if names == ["all-linear"]:  # full names, as PEFT's own expansion (a short one such as "0" names others too)
        return full_names
    expanded = {"all-linear": linear, "all-embedding": embedding}
    return list(dict.fromkeys(m for name in names for m in expanded.get(name, [name])))


def freeze(model: PreTrainedModel, prefixes: list[str], ratio: float, keep: list[str]) -> None:
    """Freeze parameters by name prefix and/or the first `ratio` of parameter elements from the bottom
    (as ms-swift: the first tensors whose running total of elements stays within the ratio);
    `keep` prefixes stay trainable."""
    params = list(model.named_parameters())
    for flag, given in (("freeze_parameters", prefixes), ("trainable_parameters", keep)):
        for pre in given:
            if not any(name.startswith(pre) for name, _ in params):
                raise SwiftError(f"--{flag} {pre}: no parameter name starts with it (they start e.g. "
                                 f"{params[0][0]})")
    budget, n_ratio = int(sum(_numel(p) for _, p in params) * ratio), 0
    for _, p in params:
        if budget < _numel(p):
            break
        budget, n_ratio = budget - _numel(p), n_ratio + 1
    for i, (name, p) in enumerate(params):
        frozen = i < n_ratio or any(name.startswith(pre) for pre in prefixes)
        if any(name.startswith(pre) for pre in keep):
            frozen = False
        p.requires_grad_(not frozen)

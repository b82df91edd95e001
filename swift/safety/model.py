"""The model a safety command studies: any model `swift infer` loads, with at most one LoRA adapter."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from swift.utils.registry import SwiftError


@dataclass
class AdapterArguments:
    adapters: list[str] = field(default_factory=list, metadata={
        "help": "A LoRA adapter directory applied to --model (its base model is used when --model is omitted)."})

    def __post_init__(self) -> None:
        if isinstance(self.adapters, str):
            self.adapters = [self.adapters]
        if len(self.adapters) > 1:
            raise SwiftError("--adapters: one model is studied at a time; give one adapter (swift merge-lora folds "
                             "several into one model)")


def check_causal_lm(a) -> None:
    """--task_type / --num_labels: a safety command studies a causal language model."""
    if a.task_type != "causal_lm" or a.num_labels is not None:
        raise SwiftError(f"--task_type {a.task_type}" + (" --num_labels" if a.num_labels is not None else "")
                         + ": attacks and estimates study a causal language model")


def load_studied_model(a):
    """(model, tokenizer, model_type): eval mode, frozen, on the GPU when there is one."""
    from swift.arguments.infer import named_adapters
    from swift.infer.factory import _model_id
    from swift.model import load_model
    from swift.model.loader import bnb_config

    check_causal_lm(a)
    adapters = named_adapters(a.adapters)
    model, tokenizer, info = load_model(_model_id(a, adapters), use_hf=a.use_hf, revision=a.model_revision,
                                        torch_dtype=a.torch_dtype, attn_impl=a.attn_impl,
                                        check_model=a.check_model, quantization=bnb_config(a))
    if torch.cuda.is_available() and a.quant_bits is None:
        model.to("cuda")
    for name, path in adapters.items():
        from swift.tuners import PeftModel

        model = PeftModel.from_pretrained(model, path, adapter_name=name)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tokenizer, info.model_type


def special_ids(tokenizer) -> set[int]:
    """Control tokens: the tokenizer's special tokens and every added token marked special (transformers 5
    leaves chat markers such as <|im_start|> out of `all_special_ids`)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return set(tokenizer.all_special_ids) | {i for i, token in added.items() if getattr(token, "special", False)}


def studied_template(a, model_type: str | None, tokenizer):
    """The chat template the studied model talks through: --template, else the one --model_type or
    the model's config names; --system as its default system prompt."""
    from swift.template import choose_template, get_template

    return get_template(choose_template(a.template, a.model_type, model_type, tokenizer), tokenizer, system=a.system)

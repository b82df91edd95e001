"""Chat templates. `get_template(name, tokenizer, ...)`; `infer_template(model_type, tokenizer)`."""
from __future__ import annotations

from swift.template import formats, jinja  # noqa: F401  (register the built-in templates)
from swift.template.base import IGNORE_INDEX, TEMPLATES, Encoded, RowError, Template
from swift.utils.registry import SwiftError

# Families whose template is known when a tokenizer ships no chat_template of its own (by the
# config's model_type).
MODEL_TYPE_TEMPLATES = {"qwen2": "qwen", "qwen3": "qwen3", "qwen2_moe": "qwen", "qwen3_moe": "qwen3"}
LLAMA2 = "Llama 2's [INST] template is not implemented; for Llama 3 pass --template llama3 or --template jinja"
# ms-swift's --model_type names of the families supported here: (the config's model_type, template)
MS_SWIFT_MODEL_TYPES = {
    "qwen2": ("qwen2", "qwen"), "qwen2_moe": ("qwen2_moe", "qwen"), "qwen2_5": ("qwen2", "qwen2_5"),
    "qwen2_5_math": ("qwen2", "qwen2_5_math"), "qwen3": ("qwen3", "qwen3"), "qwen3_moe": ("qwen3_moe", "qwen3"),
    "llama3": ("llama", "llama3"), "llama3_1": ("llama", "llama3_2"),
    "llama3_2": ("llama", "llama3_2"),
}


def choose_template(template: str | None, model_type: str | None, config_type: str, tokenizer) -> str:
    """`--template`, else `--model_type`'s (ms-swift's names, checked against the config), else inferred."""
    from_type = check_model_type(model_type, config_type) if model_type else None
    return template or from_type or infer_template(config_type, tokenizer)


def infer_template(model_type: str, tokenizer) -> str:
    """The tokenizer's own chat template wins; otherwise the family's registered template."""
    if getattr(tokenizer, "chat_template", None):
        return "jinja"
    if model_type in MODEL_TYPE_TEMPLATES:
        return MODEL_TYPE_TEMPLATES[model_type]
    if model_type == "llama":  # Llama 2 and Llama 3 alike; only Llama 3's vocabulary has <|eot_id|>
        if "<|eot_id|>" not in _special_texts(tokenizer):
            raise SwiftError(f"cannot infer a template for model_type 'llama' without <|eot_id|> (Llama 2?): {LLAMA2}")
        return "llama3"
    raise SwiftError(f"cannot infer a template for model_type '{model_type}'; pass --template "
                     f"({', '.join(sorted(TEMPLATES))})")


def check_model_type(requested: str, config_type: str) -> str:
    """The template of ms-swift's `--model_type requested`, which must describe this architecture."""
    if requested == "llama":  # ms-swift's `llama` is the Llama 2 family
        raise SwiftError(f"--model_type llama is ms-swift's Llama 2 family: {LLAMA2} (or --model_type llama3)")
    if requested not in MS_SWIFT_MODEL_TYPES:
        raise SwiftError(f"--model_type {requested!r} is not one of {', '.join(MS_SWIFT_MODEL_TYPES)} (leave it out "
                         "to use the model's config)")
    architecture, template = MS_SWIFT_MODEL_TYPES[requested]
    if architecture != config_type:
        raise SwiftError(f"--model_type {requested} is a {architecture} model, but this model's config.json says "
                         f"model_type {config_type!r}")
    return template


def _special_texts(tokenizer) -> set[str]:
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return {t.content for t in added.values() if t.special} | set(getattr(tokenizer, "all_special_tokens", ()))


def get_template(name: str, tokenizer, **kwargs) -> Template:
    return TEMPLATES.get(name)(tokenizer, **kwargs)


__all__ = ["IGNORE_INDEX", "MS_SWIFT_MODEL_TYPES", "TEMPLATES", "Encoded", "RowError", "Template", "check_model_type",
           "choose_template", "get_template", "infer_template"]

"""Chat templates. `get_template(name, tokenizer, ...)`; `infer_template(model_type, tokenizer)`."""
from __future__ import annotations

from swift.template import formats, jinja  # noqa: F401  (register the built-in templates)
from swift.template.base import IGNORE_INDEX, TEMPLATES, Encoded, RowError, Template
from swift.utils.registry import SwiftError

# Families whose template is known when a tokenizer ships no chat_template of its own.
MODEL_TYPE_TEMPLATES = {"qwen2": "qwen", "qwen3": "qwen", "qwen2_moe": "qwen", "llama": "llama3"}


def infer_template(model_type: str, tokenizer) -> str:
    """The tokenizer's own chat template wins; otherwise the family's registered template."""
    if getattr(tokenizer, "chat_template", None):
        return "jinja"
    if model_type in MODEL_TYPE_TEMPLATES:
        return MODEL_TYPE_TEMPLATES[model_type]
    raise SwiftError(f"cannot infer a template for model_type '{model_type}'; pass --template "
                     f"({', '.join(sorted(TEMPLATES))})")


def get_template(name: str, tokenizer, **kwargs) -> Template:
    return TEMPLATES.get(name)(tokenizer, **kwargs)


__all__ = ["IGNORE_INDEX", "TEMPLATES", "Encoded", "RowError", "Template", "get_template", "infer_template"]

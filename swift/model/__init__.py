from swift.model.loader import BUILTIN_PREFIX, ModelInfo, load_model, load_tokenizer, resolve_model_dir

__all__ = ["BUILTIN_PREFIX", "ModelInfo", "load_model", "load_tokenizer", "resolve_model_dir"]

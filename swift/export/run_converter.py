"""Run llama.cpp's `convert_hf_to_gguf.py` from its tree: `python -m swift.export.run_converter TREE PRE
MODEL_DIR [converter flags]`. PRE (may be empty) is llama.cpp's name for the tokenizer's pre-tokenizer,
used only when the converter does not recognise the tokenizer by its hash (swift.export.gguf.llama_pre_tokenizer
read it from tokenizer.json); a tokenizer it knows keeps the converter's own answer."""
from __future__ import annotations

import sys


def main() -> None:
    tree, pre, model_dir, *flags = sys.argv[1:]
    sys.path[:0] = [tree, f"{tree}/gguf-py"]
    import convert_hf_to_gguf
    from conversion import base

    listed = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return listed(self, tokenizer)
        except NotImplementedError:
            if not pre:
                raise
            print(f"swift: the tokenizer is not in the converter's list; its structure is {pre!r}'s", file=sys.stderr)
            return pre

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [convert_hf_to_gguf.__file__, model_dir, *flags]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()

import copy

import pytest

LLAMA3_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


@pytest.fixture(scope="session")
def llama_tokenizer(tokenizer):
    """The tiny tokenizer with Llama 3's control tokens as special tokens (the llama3 templates refuse
    a tokenizer without them) and no chat template of its own."""
    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": LLAMA3_TOKENS})
    tok.chat_template = None
    return tok

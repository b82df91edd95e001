"""Train the byte-level BPE tokenizer of the built-in tiny model.

Corpus: the text this repository ships (its Markdown and Python files) plus
synthetic arithmetic lines from `swift.dataset.arith`. Digits are always split
into single tokens so a tiny model can learn column arithmetic.

    python scripts/train_tokenizer.py            # rewrites swift/model/assets/tiny-chat/
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "swift" / "model" / "assets" / "tiny-chat"
VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML with `{% generation %}` markers so `apply_chat_template(return_assistant_tokens_mask=True)`
# marks exactly the tokens the project trains on (content + <|im_end|>).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] }}{{ '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def corpus() -> list[str]:
    texts = []
    for path in sorted(ROOT.rglob("*")):
        if path.suffix in {".md", ".py"} and ".git" not in path.parts and path.is_file():
            texts.append(path.read_text(encoding="utf-8", errors="ignore"))
    rng = random.Random(0)
    for _ in range(2000):
        a, b = rng.randrange(100), rng.randrange(100)
        texts.append(f"What is {a}+{b}? {a}+{b}={a + b}\n")
    return texts


def model_config(tok: Tokenizer) -> dict:
    """A ~1M-parameter Qwen2 decoder; weights are never stored, only seeded."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": tok.get_vocab_size(),
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": tok.token_to_id("<|im_end|>"),
        "pad_token_id": tok.token_to_id("<|endoftext|>"),
        "torch_dtype": "float32",
    }


def main() -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 512,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (OUT / "config.json").write_text(json.dumps(model_config(tok), indent=2) + "\n")
    print(f"vocab={tok.get_vocab_size()} -> {OUT}")


if __name__ == "__main__":
    main()

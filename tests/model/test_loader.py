import os
import socket

import pytest
import torch

from swift.model import load_model
from swift.utils.registry import SwiftError


def test_builtin_is_small_qwen2_and_seeded():
    a, tok, info = load_model("builtin:tiny-chat")
    b, _, _ = load_model("builtin:tiny-chat")
    n = sum(p.numel() for p in a.parameters())
    assert info.model_type == "qwen2" and 500_000 <= n <= 2_000_000
    assert 2000 <= len(tok) <= 4096
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert tok.convert_ids_to_tokens(tok("2024", add_special_tokens=False)["input_ids"]) == ["2", "0", "2", "4"]
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tok(special, add_special_tokens=False)["input_ids"]) == 1


def test_local_dir_loads_without_network(tiny_dir, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    model, tok, info = load_model(tiny_dir, task_type="seq_cls")
    assert info.model_type == "qwen2" and not info.builtin
    assert model.config.num_labels == 1 and type(model).__name__ == "Qwen2ForSequenceClassification"


def test_unknown_builtin_and_bad_path(tmp_path):
    with pytest.raises(SwiftError, match="unknown built-in model 'builtin:huge'; valid: builtin:tiny-chat"):
        load_model("builtin:huge")
    with pytest.raises(SwiftError, match="no such local directory"):
        load_model(str(tmp_path / "nope"))
    (tmp_path / "adapter").mkdir()
    with pytest.raises(SwiftError, match="no config.json"):
        load_model(str(tmp_path / "adapter"))


def test_offline_hub_fails_in_one_line():
    with pytest.raises(SwiftError, match="Hugging Face hub .*pass a local path") as err:
        load_model("no-such-org/no-such-model", use_hf=True)
    assert "\n" not in str(err.value)


def test_check_model_stops_on_a_cut_weight_file_in_one_line(tiny_dir, tmp_path):
    """`--check_model` (on by default, as in ms-swift): a truncated download is named in one line
    before anything loads; `--check_model false` skips the check (and loading then fails its own way)."""
    import shutil
    import subprocess
    import sys

    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    argv = ["--model", str(broken), "--dataset", "builtin:arith-sft#8", "--max_steps", "1", "--output_dir",
            str(tmp_path / "out"), "--report_to", "none"]
    proc = subprocess.run([sys.executable, "-m", "swift", "sft", *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"swift sft: error: --model {broken}: weight file model.safetensors is damaged (")
    assert not (tmp_path / "out").exists()
    from swift.model.loader import check_model_files

    check_model_files(str(tiny_dir))  # an intact directory passes


def test_a_folder_without_tokenizer_files_is_refused_in_one_line(tiny_dir, tmp_path):
    """(before 2026-11-30 transformers built an empty tokenizer from the config alone, and training
    stopped later at 'dropped 9424 of 9424 rows ... no tokens left')"""
    import shutil

    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(tiny_dir, name), weights_only / name)
    with pytest.raises(SwiftError, match=f"^--model {weights_only}: no tokenizer files there \\(one of tokenizer.json"):
        load_model(str(weights_only))


def test_a_tokenizer_larger_than_the_embedding_is_refused(tiny_dir, tmp_path):
    """A tokenizer whose own vocabulary is larger than the embedding (from another model) is refused
    (before 2026-11-30 an IndexError traceback in the middle of training); added tokens beyond it,
    as Gemma-3 (<image_soft_token>) and CodeLlama-34b ship, are named in a warning and the model
    loads; a tokenizer smaller than the embedding, as many real models have, loads."""
    import shutil

    from transformers import AutoTokenizer

    model, tokenizer, _ = load_model(tiny_dir)
    small = tmp_path / "small"
    model.resize_token_embeddings(1024)
    model.save_pretrained(small)
    tokenizer.save_pretrained(small)
    with pytest.raises(SwiftError, match=f"^--model {small}: its tokenizer has {tokenizer.vocab_size} tokens but "
                                         "the model's embedding only 1024 rows"):
        load_model(str(small))
    added = tmp_path / "added"
    shutil.copytree(tiny_dir, added)
    tokenizer = AutoTokenizer.from_pretrained(added)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(100)])
    tokenizer.save_pretrained(added)
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("swift").addHandler(handler)
    try:
        load_model(str(added))
    finally:
        logging.getLogger("swift").removeHandler(handler)
    assert any("100 added token(s) of its tokenizer have no embedding row (<extra_0>" in r.getMessage() for r in records)
    model, tokenizer, _ = load_model(tiny_dir)
    model.resize_token_embeddings(2112)
    model.save_pretrained(tmp_path / "padded")
    tokenizer.save_pretrained(tmp_path / "padded")
    assert load_model(str(tmp_path / "padded"))[0].get_input_embeddings().num_embeddings == 2112

"""`swift export --exist_ok true`: an export replaces what an earlier export in --output_dir listed in its
export_args.json and nothing else (swift/export/publish.py)."""
from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from swift.utils.registry import SwiftError
from tests.export.test_export import export

USER_FILES = {"llama-3-8b-q4_k_m.gguf": "x", "mistral.gguf": "y", "embeddings.bin": "z", "notes.txt": "mine"}


def consistent(out) -> list[str]:
    """The folder holds what its manifest lists, and a Modelfile's GGUF; returns the listed names."""
    listed = json.loads((out / "export_args.json").read_text())["files"]
    assert all((out / name).exists() for name in listed), listed
    if (out / "Modelfile").exists():
        assert (out / re.search(r"^FROM \./(\S+)$", (out / "Modelfile").read_text(), re.M)[1]).is_file()
    return listed


def test_exist_ok_replaces_an_earlier_export_and_keeps_the_users_files(tmp_path, tiny_dir):
    """Before 2026-11-30 --exist_ok removed every *.gguf, *.safetensors and *.bin in --output_dir (the
    user's own too), and left half of an earlier export (a Modelfile whose GGUF was gone, a config and
    tokenizer without their weights)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swift.pipelines.export import export_main

    out = tmp_path / "models"
    out.mkdir()
    for name, text in USER_FILES.items():
        (out / name).write_text(text)
    # an Ollama export, of a model with Qwen3's chat template: one warning line names what the TEMPLATE does
    # not render as that template does
    qwen3 = tmp_path / "qwen3"
    shutil.copytree(tiny_dir, qwen3)
    tokenizer = AutoTokenizer.from_pretrained(qwen3)
    with open(os.path.join(os.path.dirname(__file__), "..", "data", "chat_templates", "qwen3.jinja")) as f:
        tokenizer.chat_template = f.read()
    tokenizer.save_pretrained(qwen3)
    proc = export("--model", str(qwen3), "--to_ollama", "true", "--output_dir", str(out), "--exist_ok", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert consistent(out) == ["Modelfile", "export_args.json", "model-f16.gguf"]
    warning = [line for line in proc.stderr.splitlines() if "--to_ollama:" in line]
    assert len(warning) == 1 and "tool definitions (Ollama's .Tools); assistant tool calls; tool messages; earlier " \
        "assistant turns (it rewrites them, e.g. drops their <think> reasoning) as the chat template does" in warning[0]
    # then an HF checkpoint into the same folder: the GGUF and its Modelfile go
    export_main(["--model", tiny_dir, "--quant_method", "bnb", "--quant_bits", "8", "--max_shard_size", "300KB",
                 "--output_dir", str(out), "--exist_ok", "true"])
    listed = consistent(out)
    assert "model.safetensors.index.json" in listed and "Modelfile" not in listed
    assert sorted(os.listdir(out)) == sorted([*listed, *USER_FILES])
    assert type(AutoModelForCausalLM.from_pretrained(out).model.layers[0].mlp.up_proj).__name__ == "Linear8bitLt"
    # then a GGUF: the whole checkpoint goes (no config or tokenizer without their weights is left)
    proc = export("--model", tiny_dir, "--to_gguf", "true", "--gguf_type", "q8_0", "--output_dir", str(out),
                  "--exist_ok", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert consistent(out) == ["export_args.json", "model-q8_0.gguf"]
    assert sorted(os.listdir(out)) == sorted(["export_args.json", "model-q8_0.gguf", *USER_FILES])
    assert {name: (out / name).read_text() for name in USER_FILES} == USER_FILES
    assert not [p for p in os.listdir(tmp_path) if ".partial-" in p or ".scratch-" in p]


def test_a_checkpoint_is_not_written_beside_weights_no_export_listed(tmp_path, tiny_dir):
    from swift.pipelines.export import export_main

    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors").write_text("not an export's")
    with pytest.raises(SwiftError, match=r"^--output_dir .* has weight files no earlier export there listed "
                                         r"\(model.safetensors\)"):
        export_main(["--model", tiny_dir, "--quant_method", "bnb", "--quant_bits", "8", "--output_dir", str(out),
                     "--exist_ok", "true"])
    assert os.listdir(out) == ["model.safetensors"]


def test_a_manifest_never_names_a_file_outside_the_folder(tmp_path):
    from swift.export.publish import listed, publish

    out, staging = tmp_path / "out", tmp_path / "staging"
    out.mkdir()
    staging.mkdir()
    (tmp_path / "outside.bin").write_text("keep")
    (out / "old.gguf").write_text("old")
    (out / "export_args.json").write_text(json.dumps({"files": ["../outside.bin", str(tmp_path / "outside.bin"),
                                                                ".", "", "old.gguf", 3]}))
    assert listed(str(out)) == {"old.gguf"}
    (staging / "export_args.json").write_text(json.dumps({"files": ["export_args.json", "new.gguf"]}))
    (staging / "new.gguf").write_text("new")
    assert publish(str(staging), str(out)) == ["export_args.json", "new.gguf"]
    assert sorted(os.listdir(out)) == ["export_args.json", "new.gguf"]
    assert (tmp_path / "outside.bin").read_text() == "keep"
    (out / "export_args.json").write_text("[not an object")
    assert listed(str(out)) == set()

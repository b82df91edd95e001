"""--max_length's default where training and `swift export --to_cached_dataset` build the template."""
from __future__ import annotations

import json
from types import SimpleNamespace

from transformers import AutoConfig

from swift.arguments import SftArguments
from swift.arguments.template import TemplateArguments, model_max_length
from swift.dataset.cache import INFO, encoding_of, load_cache
from swift.pipelines.export import export_main
from swift.pipelines.train import TrainPipeline

TINY_CONTEXT = 512  # builtin:tiny-chat's max_position_embeddings


def test_max_length_defaults_to_the_models_context():
    """ms-swift's default: None, the model's context length (before 2026-12-07: 2048 for every model,
    so a 32k-context model cut or dropped its samples at 2048 without a word). The resolved number is
    the run's --max_length: args.json records it, packing and PRM steps read it."""
    assert TemplateArguments().max_length is None
    pipeline = TrainPipeline(SftArguments(model="builtin:tiny-chat", dataset=["builtin:arith-sft#4"]))
    _, _, template, _ = pipeline.load()
    assert template.max_length == pipeline.args.max_length == TINY_CONTEXT
    assert pipeline.args.to_dict()["max_length"] == TINY_CONTEXT
    explicit = TrainPipeline(SftArguments(model="builtin:tiny-chat", dataset=["builtin:arith-sft#4"], max_length=64))
    assert explicit.load()[2].max_length == 64


def test_the_context_length_of_a_config():
    assert model_max_length(SimpleNamespace(max_position_embeddings=32768, seq_length=8192)) == 8192
    assert model_max_length(SimpleNamespace(n_positions=1024)) == 1024
    assert model_max_length(SimpleNamespace(hidden_size=8)) == 2048  # names none: the fallback
    vlm = AutoConfig.for_model("llava", text_config={"model_type": "llama", "max_position_embeddings": 4096})
    assert model_max_length(vlm) == 4096  # a multimodal model's text config


def test_a_cache_records_the_resolved_max_length_and_training_accepts_it(tmp_path):
    out = tmp_path / "cache"
    export_main(["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft#8", "--to_cached_dataset", "true",
                 "--output_dir", str(out)])
    assert json.loads((out / INFO).read_text())["encoding"]["max_length"] == TINY_CONTEXT
    pipeline = TrainPipeline(SftArguments(model="builtin:tiny-chat", cached_dataset=[str(out)]))
    train, _ = load_cache(str(out), encoding_of(pipeline.load()[2]), pipeline.args.data_seed)
    assert len(train) == 8

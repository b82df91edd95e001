"""`swift export --to_cached_dataset` and `swift sft|pt --cached_dataset`: a run on the cache is the run on
the rows (same losses, same weights, same validation), and a cache is refused where it would encode
otherwise."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from swift.pipelines.export import export_main
from swift.pipelines.train import pt_main, sft_main
from swift.utils.registry import SwiftError
from tests.conftest import train_argv

ROWS = ["--dataset", "builtin:arith-sft#64", "--split_dataset_ratio", "0.25"]
# evaluation every 2 steps: the default with validation rows, whether from --split_dataset_ratio or the cache
TRAIN = ["--max_length", "64", "--tuner_type", "full", "--eval_steps", "2", "--per_device_eval_batch_size", "4"]


def without_data(argv: list[str]) -> list[str]:
    i = argv.index("--dataset")
    return argv[:i] + argv[i + 2:]


def logged(out) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(out, "logging.jsonl"))]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    out = tmp_path_factory.mktemp("cache") / "arith"
    result = export_main(["--model", "builtin:tiny-chat", *ROWS, "--max_length", "64", "--to_cached_dataset", "true",
                          "--output_dir", str(out)])
    assert (result["train_rows"], result["val_rows"]) == (48, 16)
    return out


@pytest.mark.parametrize("packing", [False, True])
def test_training_on_the_cache_is_training_on_the_rows(tmp_path, cache, packing):
    extra = [*TRAIN, *(["--packing", "true"] if packing else [])]
    sft_main(train_argv(tmp_path / "rows", *extra, "--split_dataset_ratio", "0.25"))
    sft_main(without_data(train_argv(tmp_path / "cached", *extra, "--cached_dataset", str(cache))))
    rows, cached = logged(tmp_path / "rows"), logged(tmp_path / "cached")
    assert [r.get("loss") for r in rows] == [r.get("loss") for r in cached]
    assert [r["eval_loss"] for r in rows if "eval_loss" in r] == [r["eval_loss"] for r in cached if "eval_loss" in r]
    assert any("eval_loss" in r for r in cached)
    w_rows, w_cached = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("rows", "cached"))
    for name in w_rows:
        torch.testing.assert_close(w_cached[name], w_rows[name], rtol=0, atol=0, msg=name)


def test_a_cache_encoded_otherwise_is_refused_in_one_line(tmp_path, cache):
    # swift pt trains every token (--loss_scale all): a cache exported with sft's loss_scale would give
    # it other labels
    with pytest.raises(SwiftError, match=r"was encoded with --loss_scale 'default' \(this run: 'all'\)"):
        pt_main(without_data(train_argv(tmp_path / "pt", "--max_length", "64", "--cached_dataset", str(cache))))
    with pytest.raises(SwiftError, match=r"was encoded with --max_length 64 \(this run: 128\)"):
        sft_main(without_data(train_argv(tmp_path / "a", "--max_length", "128", "--cached_dataset", str(cache))))
    with pytest.raises(SwiftError, match=r"was encoded with --template 'jinja' \(this run: 'chatml'\)"):
        sft_main(without_data(train_argv(tmp_path / "b", "--max_length", "64", "--template", "chatml",
                                         "--cached_dataset", str(cache))))
    with pytest.raises(SwiftError, match="no cache_info.json there"):
        sft_main(without_data(train_argv(tmp_path / "c", "--cached_dataset", str(tmp_path))))
    for flags, message in [(["--dataset", "builtin:arith-sft#8"], "--dataset reads or encodes rows"),
                           (["--lazy_tokenize", "true"], "--lazy_tokenize is about reading rows"),
                           (["--strict", "true"], "--strict reads or encodes rows"),
                           # the cache's rows were sampled, shuffled and split with seed 42
                           (["--data_seed", "7", "--max_length", "64"], "export it again with --seed 7"),
                           (["--predict_with_generate", "true"], "--predict_with_generate prompts the model")]:
        with pytest.raises(SwiftError, match=message):
            sft_main([*without_data(train_argv(tmp_path / "d", "--cached_dataset", str(cache))), *flags])
    from swift.pipelines.rlhf import rlhf_main

    with pytest.raises(SwiftError, match="--cached_dataset holds sft/pt samples"):
        rlhf_main(without_data(train_argv(tmp_path / "e", "--rlhf_type", "dpo", "--cached_dataset", str(cache))))


def test_pt_trains_on_a_cache_exported_with_its_loss_scale(tmp_path):
    out = tmp_path / "pt-cache"
    export_main(["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-pt#32", "--max_length", "64",
                 "--loss_scale", "all", "--to_cached_dataset", "true", "--output_dir", str(out)])
    run = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--logging_steps", "1", "--save_strategy", "no",
           "--report_to", "none", "--disable_tqdm", "true", "--add_version", "false", "--max_length", "64"]
    pt_main(["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-pt#32", "--output_dir", str(tmp_path / "rows"),
             *run])
    pt_main(["--model", "builtin:tiny-chat", "--cached_dataset", str(out), "--output_dir", str(tmp_path / "cached"),
             *run])
    assert [r.get("loss") for r in logged(tmp_path / "rows")] == [r.get("loss") for r in logged(tmp_path / "cached")]


def test_export_refusals(tmp_path):
    base = ["--model", "builtin:tiny-chat", "--to_cached_dataset", "true"]
    for flags, message in [([], "--to_cached_dataset needs --dataset"),
                           (["--dataset", "x", "--merge_lora", "true"], "leave out --merge_lora"),
                           (["--dataset", "x", "--truncation_strategy", "middle"], "--truncation_strategy 'middle'"),
                           (["--dataset", "x", "--val_dataset", "y", "--split_dataset_ratio", "0.1"],
                            "--val_dataset is the validation data; --split_dataset_ratio would hold out rows")]:
        with pytest.raises(SwiftError, match=message):
            export_main([*base, *flags, "--output_dir", str(tmp_path / "o")])
    with pytest.raises(SwiftError, match="--system is read only with --to_cached_dataset true"):
        export_main(["--model", "builtin:tiny-chat", "--to_gguf", "true", "--system", "hi"])
    assert not (tmp_path / "o").exists()


def test_an_export_over_an_earlier_cache_leaves_none_of_its_parts(tmp_path):
    out = tmp_path / "cache"
    export_main(["--model", "builtin:tiny-chat", *ROWS, "--to_cached_dataset", "true", "--output_dir", str(out)])
    assert (out / "val").is_dir()
    export_main(["--model", "builtin:tiny-chat", "--dataset", "builtin:arith-sft#32", "--seed", "7", "--to_cached_dataset",
                 "true", "--output_dir", str(out), "--exist_ok", "true"])
    assert not (out / "val").exists()
    info = json.loads((out / "cache_info.json").read_text())
    assert (info["rows"], info["seed"]) == ({"train": 32, "val": 0}, 7)
    result = sft_main(without_data(train_argv(tmp_path / "run", "--cached_dataset", str(out), "--data_seed", "7",
                                              "--max_steps", "1")))
    assert result["global_step"] == 1 and "eval_loss" not in result["metrics"]

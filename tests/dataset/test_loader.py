import csv
import json

import pytest

from swift.dataset.loader import DatasetSpec, load_rows, load_split
from swift.utils.registry import SwiftError


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def qa(i):
    return {"query": f"q{i}", "response": f"r{i}"}


def test_spec_parsing():
    assert DatasetSpec.parse("org/name:sub#500") == DatasetSpec("org/name", "sub", 500)
    assert DatasetSpec.parse("builtin:arith-sft:eval#10") == DatasetSpec("builtin:arith-sft", "eval", 10)
    assert DatasetSpec.parse("data.jsonl") == DatasetSpec("data.jsonl", None, None)
    with pytest.raises(SwiftError, match="row count"):
        DatasetSpec.parse("data.jsonl#abc")


def test_file_types(tmp_path):
    rows = [qa(i) for i in range(5)]
    jsonl = write_jsonl(tmp_path / "a.jsonl", rows)
    (tmp_path / "b.json").write_text(json.dumps(rows))
    with open(tmp_path / "c.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["query", "response"])
        w.writeheader()
        w.writerows(rows)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    (tmp_path / "e.txt").write_text("line one\n\nline two\n")
    for name in ("a.jsonl", "b.json", "c.csv", "d.parquet"):
        got = load_rows([str(tmp_path / name)])
        assert [r["messages"][-1]["content"] for r in got.rows] == [f"r{i}" for i in range(5)], name
    assert load_rows([str(tmp_path / "e.txt")]).rows == [{"text": "line one"}, {"text": "line two"}]
    assert len(load_rows([jsonl, str(tmp_path / "b.json")])) == 10  # mixing


def test_sampling_and_repeating(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [qa(i) for i in range(10)])
    few = load_rows([path + "#4"], seed=1)
    assert len(few) == 4 and len({r["messages"][0]["content"] for r in few.rows}) == 4
    many = load_rows([path + "#25"], seed=1)
    counts = {}
    for r in many.rows:
        counts[r["messages"][0]["content"]] = counts.get(r["messages"][0]["content"], 0) + 1
    assert len(many) == 25 and min(counts.values()) == 2 and max(counts.values()) == 3
    assert load_rows([path + "#4"], seed=1).rows == few.rows  # deterministic


def test_bad_rows_dropped_or_strict(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(qa(0)) + "\n{not json\n" + json.dumps({"messages": []}) + "\n" + json.dumps(qa(1)) + "\n")
    rows = load_rows([str(path)])
    assert len(rows) == 2 and sum(rows.dropped.values()) == 2
    line = rows.report("train")
    assert "dropped 2 of 4 rows read" in line and "bad.jsonl row 2" in line
    with pytest.raises(SwiftError, match=r"bad\.jsonl row 2: invalid JSON"):
        load_rows([str(path)], strict=True)


def test_files_that_cannot_be_read_stop_in_one_line_and_a_bad_line_is_its_rows_error(tmp_path):
    """(before 2026-11-29 each was a UnicodeDecodeError or pyarrow traceback)"""
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(json.dumps(qa(0)).encode() + b"\n" + b'{"query": "\xff", "response": "1"}\n')
    rows = load_rows([str(mixed)])
    assert len(rows) == 1 and "1 × not UTF-8 text (byte 0xff at column 12)" in rows.report("train")
    (tmp_path / "latin.csv").write_bytes(b"query,response\n\xff,1\n")
    (tmp_path / "fake.parquet").write_text("not parquet")
    for name, problem in (("latin.csv", "not UTF-8 text"), ("fake.parquet", "not a readable parquet file")):
        with pytest.raises(SwiftError, match=f"{name}: {problem}") as err:
            load_rows([str(tmp_path / name)])
        assert "\n" not in str(err.value)


def test_a_sample_of_n_rows_reports_the_rows_read(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(qa(i)) + "\n" for i in range(9)) + json.dumps({"messages": []}) + "\n")
    assert "dropped 1 of 10 rows read" in load_rows([str(path) + "#3"]).report("train")  # was "of 4"


def test_missing_file_and_offline_hub(tmp_path):
    with pytest.raises(SwiftError, match="no such file"):
        load_rows([str(tmp_path / "nope.jsonl")])
    with pytest.raises(SwiftError, match="^--val_dataset .*nope.jsonl: no such file"):
        load_rows([str(tmp_path / "nope.jsonl")], flag="--val_dataset")
    with pytest.raises(SwiftError, match="cannot download dataset 'no-org/no-data' from the Hugging Face hub") as err:
        load_rows(["no-org/no-data#10"], use_hf=True)
    assert "\n" not in str(err.value)


def test_builtin_split_is_deterministic_and_disjoint():
    train = load_rows(["builtin:arith-sft"])
    val = load_rows(["builtin:arith-sft:eval"])
    prompts = {r["messages"][0]["content"] for r in train.rows}
    assert len(val) > 400 and not prompts & {r["messages"][0]["content"] for r in val.rows}
    assert len(train) + len(val) == 10000
    # split by unordered pair: no eval sum has its swapped twin (b+a) in training
    swapped = {"+".join(reversed(r["messages"][0]["content"].rstrip("=").split("+"))) + "=" for r in val.rows}
    assert not prompts & swapped


def test_split_dataset_ratio(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [qa(i) for i in range(20)])
    train, val = load_split([path], 0.25, seed=0)
    assert len(train) == 15 and len(val) == 5


def test_self_cognition_rows_get_the_model_name_and_author(tmp_path):
    """ms-swift's self-cognition recipe: `--model_name 小黄 'Xiao Huang' --model_author 魔搭 ModelScope`
    fills {{NAME}}/{{AUTHOR}} (Chinese rows the first form, English rows the second), through the
    training pipeline's own data path; rows with a placeholder and no flag stop with one line."""
    from swift.arguments import SftArguments
    from swift.pipelines.train import TrainPipeline
    from swift.utils.registry import SwiftError

    argv = dict(model="builtin:tiny-chat", dataset=["builtin:self-cognition"], output_dir=str(tmp_path))
    pipeline = TrainPipeline(SftArguments(**argv, model_name=["小黄", "Xiao Huang"], model_author=["魔搭", "ModelScope"]))
    _, tokenizer, template, _ = pipeline.load()
    train, _, _ = pipeline.datasets(template)
    texts = [tokenizer.decode(train[i]["input_ids"]) for i in range(len(train))]
    assert not any("{{" in t for t in texts)
    assert any("I am Xiao Huang, an AI assistant developed by ModelScope." in t for t in texts)
    assert any("由魔搭开发" in t for t in texts) and not any("Xiao Huang" in t and "你" in t for t in texts)
    with pytest.raises(SwiftError, match="contain \\{\\{AUTHOR\\}\\}: pass --model_author"):
        TrainPipeline(SftArguments(**argv, model_name=["Bot"])).datasets(template)
    # without either flag, braces are left alone (they may be ordinary text); ms-swift's rows say `tag`
    from swift.dataset.self_cognition import fill_identity

    rows = [{"messages": [{"role": "user", "content": "{{NAME}}?"}]},
            {"messages": [{"role": "user", "content": "{{NAME}}?"}], "tag": "zh"}]
    assert fill_identity(rows, [], []) == 0 and rows[0]["messages"][0]["content"] == "{{NAME}}?"
    assert fill_identity(rows, ["小黄", "Xiao Huang"], []) == 2
    assert [r["messages"][0]["content"] for r in rows] == ["Xiao Huang?", "小黄?"]
    # streaming rows are filled as they are read (ms-swift's streaming example uses --model_name)
    streaming = TrainPipeline(SftArguments(**argv, streaming=True, max_steps=2, model_name=["Xiao Huang"],
                                           model_author=["ModelScope"]))
    train, _, _ = streaming.datasets(template)
    first = [tokenizer.decode(s["input_ids"]) for s, _ in zip(train, range(22))]
    assert any("Xiao Huang" in t for t in first) and not any("{{" in t for t in first)


def test_held_out_rows_are_never_training_rows(tmp_path):
    """--split_dataset_ratio holds rows out of each dataset before its `#N` sample is taken from the
    rest (ms-swift's order), so with N over the dataset's size no row is in both (before 2026-12-07
    the repeats were split: validation rows were trained on). The N rows include the held-out ones."""
    from swift.arguments.data import DataArguments
    from swift.dataset.loader import read_rows

    path = write_jsonl(tmp_path / "a.jsonl", [qa(i) for i in range(10)])
    for spec, n_train, n_val in ((path + "#25", 23, 2), (path + "#5", 4, 1), (path, 8, 2)):
        train, val = read_rows(DataArguments(dataset=[spec], split_dataset_ratio=0.2), 42, False)
        assert not set(train.origins) & set(val.origins), spec
        assert (len(train), len(val)) == (n_train, n_val), spec
    with pytest.raises(SwiftError, match=r"a\.jsonl#1: --split_dataset_ratio 0\.2 holds out 1 of its 1 rows"):
        load_split([path + "#1"], 0.2)


def test_a_file_with_hash_in_its_name_and_bad_specs_before_the_model(tmp_path, monkeypatch):
    """An existing v#2.jsonl is that file, not 2 rows of `v` (before 2026-12-07 it was refused as a
    row count); a bad `#N` is refused with the arguments, a missing file or unknown built-in before
    the model loads (before 2026-12-07: after it)."""
    from swift.arguments import SftArguments
    from swift.pipelines.train import TrainPipeline

    path = write_jsonl(tmp_path / "v#2.jsonl", [qa(i) for i in range(3)])
    assert len(load_rows([path])) == 3 and len(load_rows([path + "#5"])) == 5
    with pytest.raises(SwiftError, match="the part after '#' must be a positive row count"):
        SftArguments(model="builtin:tiny-chat", dataset=[str(tmp_path / "v#x")])

    def no_model(self):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(TrainPipeline, "load", no_model)
    for kwargs, problem in (({"dataset": [str(tmp_path / "nope.jsonl")]}, "^--dataset .*nope.jsonl: no such file"),
                            ({"dataset": [path], "val_dataset": [str(tmp_path / "v.csv")]},
                             "^--val_dataset .*v.csv: no such file"),
                            ({"dataset": ["builtin:arith-sfy"]}, "unknown built-in dataset 'arith-sfy'"),
                            ({"dataset": ["builtin:arith-sft:dev"]}, "subset 'dev' is not one of train, eval")):
        pipeline = TrainPipeline(SftArguments(model="builtin:tiny-chat", output_dir=str(tmp_path / "out"), **kwargs))
        with pytest.raises(SwiftError, match=problem):
            pipeline.build_trainer()


def test_file_shapes_read_as_hf_reads_them(tmp_path):
    """A .json file of JSON lines is read by line, as HF's json loader does; a single object is one
    row unless it wraps a list of rows; an empty CSV cell is a missing value (before 2026-12-07 the
    first was refused, `{"messages": [...]}` was read as one row per message, and an empty `system`
    cell was an empty system turn)."""
    (tmp_path / "lines.json").write_text("".join(json.dumps(qa(i)) + "\n" for i in range(3)))
    assert [r["messages"][0]["content"] for r in load_rows([str(tmp_path / "lines.json")]).rows] == ["q0", "q1", "q2"]
    one = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    (tmp_path / "one.json").write_text(json.dumps(one, indent=2))
    assert load_rows([str(tmp_path / "one.json")]).rows == [one]
    (tmp_path / "wrapped.json").write_text(json.dumps({"version": 1, "data": [qa(0), qa(1)]}))
    assert len(load_rows([str(tmp_path / "wrapped.json")])) == 2
    with open(tmp_path / "s.csv", "w", newline="") as f:
        csv.writer(f).writerows([["system", "query", "response"], ["", "q", "a"], ["be brief", "q", "a"]])
    rows = load_rows([str(tmp_path / "s.csv")]).rows
    assert [m["role"] for m in rows[0]["messages"]] == ["user", "assistant"]
    assert rows[1]["messages"][0] == {"role": "system", "content": "be brief"}


def hub_tree(tmp_path, monkeypatch, files: dict[str, str]):
    """A downloaded hub dataset: `files` under a snapshot folder that snapshot_download returns."""
    from swift.dataset import loader

    root = tmp_path / "snapshot"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setattr(loader, "snapshot_download", lambda *a, **k: str(root))


def test_hub_subsets_are_given_not_mixed_and_only_data_files_are_read(tmp_path, monkeypatch):
    """A hub dataset whose files lie in several subset folders needs `:subset`, which names a whole
    folder or file; README, LICENSE.txt and dataset_infos.json are never rows (before 2026-12-07 the
    subsets were mixed, `:subset` matched part of a name, and stray .txt/.json files were read)."""
    line = lambda q: json.dumps(qa(q)) + "\n"  # noqa: E731
    hub_tree(tmp_path, monkeypatch, {"main/train.jsonl": line("m"), "main/test.jsonl": line("mt"),
                                     "socratic/train.jsonl": line("s"), "mainly/train.jsonl": line("x"),
                                     "README.md": "# card", "LICENSE.txt": "MIT", "dataset_infos.json": "{}"})
    with pytest.raises(SwiftError, match=r"^dataset 'org/gsm' has several subsets \(main, mainly, socratic\): "
                                         r"give one, e.g. 'org/gsm:main'$"):
        load_rows(["org/gsm"])
    assert [r["messages"][0]["content"] for r in load_rows(["org/gsm:main"]).rows] == ["qm"]
    assert [r["messages"][0]["content"] for r in load_rows(["org/gsm:socratic"]).rows] == ["qs"]
    with pytest.raises(SwiftError, match=r"subset 'mai' has no data files \(its subsets: main, mainly, socratic\)"):
        load_rows(["org/gsm:mai"])


def test_hub_split_folders_and_stray_files(tmp_path, monkeypatch):
    line = lambda q: json.dumps(qa(q)) + "\n"  # noqa: E731
    hub_tree(tmp_path, monkeypatch, {"data/train/part-0.jsonl": line("a"), "data/test/part-0.jsonl": line("t"),
                                     "dataset_infos.json": json.dumps({"default": {"splits": {}}}),
                                     "LICENSE.txt": "MIT", "constraints.jsonl": line("c")})
    # split folders are not subsets; the train split is read, not test, LICENSE.txt or dataset_infos.json
    assert [r["messages"][0]["content"] for r in load_rows(["org/split"]).rows] == ["qa"]


def test_hub_text_dataset(tmp_path, monkeypatch):
    hub_tree(tmp_path, monkeypatch, {"corpus.txt": "line one\nline two\n", "LICENSE.txt": "MIT", "README.md": "x"})
    assert load_rows(["org/text"]).rows == [{"text": "line one"}, {"text": "line two"}]


def test_infer_and_sample_read_the_hub_they_are_told(tmp_path):
    """--use_hf reaches swift infer's --val_dataset and swift sample's --dataset, and infer names its
    own flag (before 2026-12-07 both read ModelScope and infer's errors said --dataset)."""
    from swift.pipelines.infer import InferArguments, batch_infer
    from swift.pipelines.sample import sample_main

    hf = "cannot download dataset 'no-org/no-data' from the Hugging Face hub"
    a = InferArguments(model="builtin:tiny-chat", val_dataset=["no-org/no-data"], use_hf=True)
    with pytest.raises(SwiftError, match=hf):
        batch_infer(a, None, None)
    a = InferArguments(model="builtin:tiny-chat", val_dataset=[str(tmp_path / "nope.jsonl")])
    with pytest.raises(SwiftError, match="^--val_dataset .*nope.jsonl: no such file"):
        batch_infer(a, None, None)
    with pytest.raises(SwiftError, match=hf):
        sample_main(["--model", "builtin:tiny-chat", "--dataset", "no-org/no-data", "--use_hf", "true",
                     "--output_dir", str(tmp_path / "s")])


def test_data_seed_is_42_whatever_the_seed(tmp_path, tokenizer):
    """--data_seed (ms-swift's default 42) picks the rows sampled and held out, and their order;
    --seed does not (before 2026-12-07 it did: data_seed fell back to it). With --streaming rows are
    read in order, so an explicit --data_seed or --dataset_shuffle true is refused."""
    from swift.arguments import SftArguments
    from swift.pipelines.train import TrainPipeline
    from swift.template import get_template

    path = write_jsonl(tmp_path / "a.jsonl", [qa(i) for i in range(30)])
    template = get_template("chatml", tokenizer, max_length=64)
    rows = {}
    for seed, data_seed in ((1, None), (2, None), (1, 7)):
        pipeline = TrainPipeline(SftArguments(model="builtin:tiny-chat", dataset=[path + "#12"], seed=seed,
                                              split_dataset_ratio=0.25, data_seed=data_seed))
        train, _, val = pipeline.datasets(template)
        rows[seed, data_seed] = ([s["input_ids"] for s in train], [r["messages"][0]["content"] for r in val])
    assert rows[1, None] == rows[2, None] != rows[1, 7]
    assert pipeline.args.data_seed == 7 and TrainPipeline(SftArguments(model="m", dataset=[path])).args.data_seed == 42
    stream = dict(model="builtin:tiny-chat", dataset=[path], streaming=True, max_steps=2)
    assert SftArguments(**stream).dataset_shuffle is False and SftArguments(model="m", dataset=[path]).dataset_shuffle
    with pytest.raises(SwiftError, match="^--dataset_shuffle true: --streaming reads rows in the files' order"):
        SftArguments(**stream, dataset_shuffle=True)
    with pytest.raises(SwiftError, match="^--data_seed: --streaming reads rows in order"):
        TrainPipeline(SftArguments(**stream, data_seed=3))

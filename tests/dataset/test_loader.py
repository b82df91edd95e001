import csv
import json

import pytest

from swift.dataset.loader import DatasetSpec, load_rows, split_rows
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
    train, val = split_rows(load_rows([path]), 0.25, seed=0)
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

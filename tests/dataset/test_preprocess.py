import pytest

from swift.dataset.preprocess import standardize
from swift.template.base import RowError


def test_messages_pass_through_and_extra_columns_are_kept():
    row = standardize({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                       "solution": "42"})
    assert row["messages"][1] == {"role": "assistant", "content": "yo"}
    assert row["solution"] == "42"


def test_sharegpt():
    row = standardize({"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"},
                                         {"from": "gpt", "value": "a"}]})
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]


def test_alpaca_with_input_and_history():
    row = standardize({"instruction": "Add", "input": "1 and 2", "output": "3", "history": [["hi", "hello"]],
                       "system": "math"})
    assert row["messages"] == [
        {"role": "system", "content": "math"},
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "Add\n1 and 2"}, {"role": "assistant", "content": "3"}]


@pytest.mark.parametrize("q,r", [("query", "response"), ("prompt", "completion"), ("question", "answer"),
                                 ("problem", "solution"), ("input", "output")])
def test_query_response_aliases(q, r):
    row = standardize({q: "Q", r: "R"})
    assert row["messages"] == [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "R"}]


def test_columns_mapping():
    row = standardize({"ask": "Q", "reply": "R"}, {"ask": "query", "reply": "response"})
    assert row["messages"][-1]["content"] == "R"


def test_preference_formats():
    swift_row = standardize({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "good"}],
                             "rejected_response": "bad"})
    trl_row = standardize({"prompt": "q", "chosen": "good", "rejected": "bad"})
    alias_row = standardize({"question": "q", "response_chosen": "good", "negative": "bad"})
    sharegpt_row = standardize({"conversations": [{"from": "human", "value": "q"}],
                                "chosen": {"from": "gpt", "value": "good"}, "rejected": {"from": "gpt", "value": "bad"}})
    conversational = standardize({"prompt": [{"role": "user", "content": "q"}],
                                  "chosen": [{"role": "assistant", "content": "good"}],
                                  "rejected": [{"role": "assistant", "content": "bad"}]})
    for row in (swift_row, trl_row, alias_row, sharegpt_row, conversational):
        assert row["messages"] == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "good"}]
        assert row["rejected_response"] == "bad"


def test_hh_rlhf_transcripts():
    row = standardize({"chosen": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: help?\n\nAssistant: sure",
                       "rejected": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: help?\n\nAssistant: no"})
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "user", "assistant"]
    assert row["messages"][-1]["content"] == "sure" and row["rejected_response"] == "no"


def test_kto_label():
    row = standardize({"prompt": "q", "completion": "a", "label": "false"})
    assert row["label"] is False


def test_content_parts_are_read_as_the_server_reads_them():
    """OpenAI's text parts are joined, a tool's object result is JSON, a number is its text (before
    2026-11-29 the model was trained on their Python repr, never seen when serving)."""
    row = standardize({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "1+"}, {"type": "text", "text": "1="}]},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": {"a": 1}}]},
        {"role": "tool", "content": {"sum": 2}}, {"role": "assistant", "content": 2}]})
    assert [m["content"] for m in row["messages"]] == ["1+1=", "", '{"sum": 2}', "2"]


def test_raw_text():
    assert standardize({"text": "hello"}) == {"text": "hello"}


@pytest.mark.parametrize("raw,problem", [
    ({"messages": []}, "messages is empty"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "role 'robot'"),
    ({"messages": [{"role": "user", "content": None}]}, "has no content"),
    ({"prompt": "q", "chosen": "same", "rejected": "same"}, "equals the chosen"),
    ({"foo": 1}, "no conversation found"),
    # malformed shapes are the row's error (before 2026-11-29 a traceback ended the run)
    ({"messages": "hello"}, "messages must be a list of message objects"),
    ({"messages": [1, 2]}, "messages must be a list of message objects"),
    ({"query": "1+1=", "response": "2", "history": [["a"]]}, "history entry .* is not a \\[query, response\\] pair"),
    ({"conversations": None}, "conversations must be a list"),
    ({"prompt": [1], "completion": "a"}, "prompt must be a list of message objects"),
    ({"prompt": "q", "completion": "a", "label": -1}, "label -1 is not a boolean"),
    ({"prompt": "q", "completion": "a", "label": 2}, "label 2 is not a boolean"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
                   {"role": "assistant", "content": "a"}]}, "message 0 has a 'image_url' part; text parts only"),
    ({"messages": [{"role": "user", "content": True}, {"role": "assistant", "content": "a"}]}, "content True"),
])
def test_bad_rows(raw, problem):
    with pytest.raises(RowError, match=problem):
        standardize(raw)


def test_shared_real_datasets_load(tmp_path):
    """The public datasets in shared/data parse without dropping rows."""
    import os

    from swift.dataset.loader import load_rows

    data = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data")
    if not os.path.isdir(data):
        pytest.skip("shared/data not present")
    for name, n in [("alpaca_en_demo.json", 999), ("dpo_en_demo.json", 300), ("gsm8k_test.jsonl", 1319),
                    ("oaast_sft_zh.json", 689), ("math500_test.jsonl", 500)]:
        rows = load_rows([os.path.join(data, name)])
        assert len(rows) == n, name
    hh = load_rows([os.path.join(data, "hh_rlhf_harmless_base_test.jsonl") + "#50"])
    assert all("rejected_response" in r for r in hh.rows)


def test_problem_solution_rows_keep_the_solution_column():
    """ms-swift's GRPO examples use {problem, solution}: `solution` is the answer and stays a column
    that the accuracy reward reads."""
    row = standardize({"problem": "What is 1+1?", "solution": "\\boxed{2}"})
    assert row["messages"] == [{"role": "user", "content": "What is 1+1?"},
                               {"role": "assistant", "content": "\\boxed{2}"}]
    assert row["solution"] == "\\boxed{2}"
    assert "response" not in row and standardize({"query": "q", "response": "r"}).keys() == {"messages"}

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


def test_label_is_kept_as_written_and_read_as_a_boolean_by_kto_alone(tokenizer):
    """A `label` column is the row's own (an sft file's "positive", a GRPO answer "4" or 1 for the
    reward functions); KTO's encoder reads it as true/false. (Before 2026-12-07 every command made
    it a bool: those sft and GRPO rows were dropped, and 1 reached the reward functions as True.)"""
    from swift.pipelines.rlhf import encode_unpaired
    from swift.template import get_template

    for label in ("positive", "4", 1, None):
        assert standardize({"prompt": "q", "completion": "a", "label": label})["label"] == label
    assert type(standardize({"prompt": "q", "completion": "a", "label": 1})["label"]) is int
    template = get_template("chatml", tokenizer)
    assert encode_unpaired(template, standardize({"prompt": "q", "completion": "a", "label": "false"}))["label"] is False
    assert encode_unpaired(template, standardize({"prompt": "q", "completion": "a", "label": 1.0}))["label"] is True
    for label, problem in ((-1, "label -1 is not a boolean"), (2, "label 2 is not a boolean"),
                           ("positive", "label 'positive' is not a boolean"), (None, "label None is not a boolean")):
        with pytest.raises(RowError, match=problem):
            encode_unpaired(template, standardize({"prompt": "q", "completion": "a", "label": label}))


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
    # tools and tool calls of another shape (before 2026-12-07 the template stopped the run with a
    # KeyError, AttributeError or TypeError, --strict false too)
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"arguments": "{}"}}]}]}, "message 1 has a tool call without a name"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": ["add"]}]},
     "message 1 has tool_calls \\['add'\\]; expected a list of call objects"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": {
        "name": "add"}}]}, "message 1 has tool_calls"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": "add"}]}]}, "message 1 has a tool call without a name"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "tool_call", "content": '{"name": 3}'}]},
     "message 1 has a tool call without a name"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": 5},
     "tools must be a list of tool objects"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": '{"name": "f"}'},
     "tools must be a list of tool objects"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": ["f"]},
     "tools must be a list of tool objects"),
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


def test_badly_shaped_tools_are_dropped_and_counted_not_a_traceback(tmp_path, tokenizer):
    """Rows whose tools or tool calls the template cannot render are the row's error when read:
    dropped and counted with --strict false, named with --strict true; the other rows encode."""
    import json

    from swift.dataset.encode import encode_rows
    from swift.dataset.loader import load_rows
    from swift.template import get_template
    from swift.utils.registry import SwiftError

    turn = [{"role": "user", "content": "q"}]
    rows = [{"messages": [*turn, {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}]},
            {"messages": [*turn, {"role": "assistant", "content": "", "tool_calls": ["f"]}]},
            {"messages": [*turn, {"role": "assistant", "content": "a"}], "tools": 5},
            {"messages": [*turn, {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
             "tools": json.dumps([{"type": "function", "function": {"name": "f"}}])}]
    path = tmp_path / "tools.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_rows([str(path)])
    assert len(loaded) == 1 and sum(loaded.dropped.values()) == 3
    assert len(encode_rows(loaded, get_template("chatml", tokenizer), strict=True)) == 1
    with pytest.raises(SwiftError, match=r"tools\.jsonl row 1: message 1 has a tool call without a name"):
        load_rows([str(path)], strict=True)


@pytest.mark.parametrize("raw", [
    {"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
    {"conversation": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
    {"conversation": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
    {"conversations": [{"from": "human", "value": "q"}, {"from": "bot", "value": "a"}]},
    {"messages": [{"from": "user", "value": "q"}, {"from": "bot", "value": "a"}]},
    {"instruction": "", "input": "q", "output": "a"},
    {"instruction": None, "input": "q", "output": "a"},
])
def test_conversation_columns_and_roles_ms_swift_reads(raw):
    """ms-swift reads a conversation from `messages`, `conversation` or `conversations`, with
    role/content or from/value keys, `bot` an assistant; an empty Alpaca instruction leaves the
    input as the query (before 2026-12-07 these rows were refused, or the query was "\\nq")."""
    assert standardize(raw)["messages"] == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]

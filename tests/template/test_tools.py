"""ms-swift's template names render what the model families' own chat templates render (the Jinja
strings in tests/data/chat_templates, applied by transformers), tools included: the Hermes layout
of Qwen2.5/Qwen3 (signatures in the system turn, <tool_call> and <tool_response> blocks). Templates
that cannot render tools refuse them in one line."""
import json
import os

import pytest

from swift.dataset.preprocess import standardize
from swift.template import RowError, choose_template, get_template
from swift.utils.registry import SwiftError

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "chat_templates")
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city (°C)",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Sum of two integers",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                                      "b": {"type": "integer"}}}}},
]
CALLS = [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
         {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]
CONVERSATION = [
    {"role": "user", "content": "Weather in Zürich, and 2+3?"},
    {"role": "assistant", "content": "", "tool_calls": CALLS},
    {"role": "tool", "content": "18"},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "It is 18 °C in Zürich; 2+3 is 5."},
    {"role": "user", "content": "And in Oslo?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": CALLS[:1]},
    {"role": "tool", "content": "-3"},
]
SYSTEM = [{"role": "system", "content": "You answer briefly."}]


def jinja(name: str, tokenizer, messages, tools, add_generation_prompt: bool, **kwargs) -> str:
    with open(os.path.join(HERE, f"{name}.jinja")) as f:
        return tokenizer.apply_chat_template(messages, tools=tools, chat_template=f.read(), tokenize=False,
                                             add_generation_prompt=add_generation_prompt, **kwargs)


@pytest.mark.parametrize("system", [[], SYSTEM])
@pytest.mark.parametrize("tools", [TOOLS, None])
def test_qwen2_5_renders_like_its_chat_template(tokenizer, system, tools):
    template = get_template("qwen2_5", tokenizer)
    messages = system + CONVERSATION
    prompt = template.encode_prompt(messages, tools)  # ends with tool results: the generation prompt follows
    assert prompt == tokenizer(jinja("qwen2_5", tokenizer, messages, tools, True), add_special_tokens=False).input_ids
    whole = messages + [{"role": "assistant", "content": "It is -3 °C in Oslo."}]
    text, spans = template.render(template.with_system(whole), tools=tools)
    assert text == jinja("qwen2_5", tokenizer, whole, tools, False)
    # loss on every assistant turn: its calls or text and <|im_end|>, nothing of the tool results
    assert [text[s:e] for s, e in spans][0] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}' \
        '\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
    assert all("<tool_response>" not in text[s:e] for s, e in spans)


# reasoning in the history: before the last user query (left out of a prompt, as Qwen3's template
# does) and after it, in a tool-calling turn of the current query (kept)
THINKING = [
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n5"},
    *CONVERSATION[:5],
    {"role": "user", "content": "And in Oslo?"},
    {"role": "assistant", "content": "<think>\nask the tool\n</think>\n\nLet me check.", "tool_calls": CALLS[:1]},
    {"role": "tool", "content": "-3"},
]


@pytest.mark.parametrize("system", [[], SYSTEM])
def test_qwen3_prompts_render_like_its_chat_template(tokenizer, system):
    """Prompts (the Qwen3 template gives the final assistant turn an empty <think> block, which
    swift, without thinking switches, does not write). Before 2026-11-30 the reasoning of turns
    before the last user query stayed in the prompt."""
    template = get_template("qwen3", tokenizer)
    for conversation in (CONVERSATION, THINKING):
        messages = system + conversation
        for tools in (TOOLS, None):
            assert template.encode_prompt(messages, tools) == tokenizer(
                jinja("qwen3", tokenizer, messages, tools, True), add_special_tokens=False).input_ids


def test_qwen3_trains_past_reasoning_as_written_except_with_last_round(tokenizer):
    """ms-swift's rule for thinking templates: training keeps every turn's reasoning, except with
    --loss_scale last_round, whose context is the prompt's (past reasoning left out)."""
    row = {"messages": THINKING + [{"role": "assistant", "content": "<think>\nread it\n</think>\n\nIt is -3 °C."}]}
    default = tokenizer.decode(get_template("qwen3", tokenizer).encode(row).input_ids)
    last = get_template("qwen3", tokenizer, loss_scale="last_round").encode(row)
    assert "add them" in default and "add them" not in tokenizer.decode(last.input_ids)
    trained = tokenizer.decode([t for t in last.labels if t != -100])
    assert trained == "<think>\nread it\n</think>\n\nIt is -3 °C.<|im_end|>"
    assert "ask the tool" in tokenizer.decode(last.input_ids)  # after the last user query: kept


def test_llama3_2_renders_like_its_chat_template_and_refuses_tools(llama_tokenizer):
    tokenizer = llama_tokenizer
    template = get_template("llama3_2", tokenizer)
    template.date = "26 Jul 2024"
    messages = [{"role": "user", "content": " What is 2+3? "}, {"role": "assistant", "content": "5"},
                {"role": "user", "content": "And 3+4?"}]
    for prefix in ([], SYSTEM):
        text, _ = template.render(template.with_system(prefix + messages), add_generation_prompt=True)
        assert text == jinja("llama3_2", tokenizer, prefix + messages, None, True, date_string="26 Jul 2024",
                             bos_token="<|begin_of_text|>")
    # the prompts GRPO and inference build (encode_continuation calls encode_prompt): one header
    expected = tokenizer(jinja("llama3_2", tokenizer, messages, None, True, date_string="26 Jul 2024",
                               bos_token="<|begin_of_text|>"), add_special_tokens=False).input_ids
    assert template.encode_continuation(messages) == template.encode_prompt(messages) == expected
    with pytest.raises(RowError, match="cannot render tools"):
        template.encode_prompt(messages, TOOLS)
    with pytest.raises(RowError, match="cannot render tools"):
        template.encode({"messages": CONVERSATION + [{"role": "assistant", "content": "x"}]})


def test_ms_swift_agent_rows_train_with_their_calls(tokenizer):
    """ms-swift's agent format (`tool_call` / `tool_response` roles, `tools` as a JSON string) gives
    the same tokens as the OpenAI form."""
    row = {"tools": json.dumps(TOOLS), "messages": [
        {"role": "user", "content": "Weather in Zürich, and 2+3?"},
        {"role": "tool_call", "content": json.dumps({"name": "get_weather", "arguments": {"city": "Zürich"}})},
        {"role": "tool_call", "content": json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}})},
        {"role": "tool_response", "content": "18"}, {"role": "tool_response", "content": "5"},
        {"role": "assistant", "content": "It is 18 °C in Zürich; 2+3 is 5."}]}
    openai = {"tools": TOOLS, "messages": CONVERSATION[:5]}
    template = get_template("qwen2_5", tokenizer)
    ours, theirs = template.encode(standardize(row)), template.encode(standardize(openai))
    assert ours.input_ids == theirs.input_ids and ours.labels == theirs.labels


def test_model_type_picks_and_checks_the_family():
    assert choose_template(None, "qwen2_5", "qwen2", None) == "qwen2_5"
    assert choose_template("chatml", "qwen2_5", "qwen2", None) == "chatml"  # --template wins
    with pytest.raises(SwiftError, match="config.json says model_type 'qwen2'"):
        choose_template(None, "llama3_2", "qwen2", None)
    with pytest.raises(SwiftError, match="is not one of"):
        choose_template(None, "gpt_oss", "qwen2", None)
    # ms-swift's `llama` is the Llama 2 family ([INST]); before 2026-11-30 it picked the Llama 3 template
    with pytest.raises(SwiftError, match="^--model_type llama is ms-swift's Llama 2 family: Llama 2's \\[INST\\]"):
        choose_template(None, "llama", "llama", None)
    assert choose_template(None, "llama3", "llama", None) == "llama3"

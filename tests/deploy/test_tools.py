"""Tool calling through `swift deploy`, with the official openai client, against the built-in tiny
model trained for 150 steps on `builtin:tool-calls` (so real calls come back): calls parsed into
`message.tool_calls` and streamed as `tool_calls` deltas, every `tool_choice`, a conversation that
carries calls and results back, and one-line refusals. The model learns which tool a question
needs and the calls' JSON; it copies argument values only roughly (a 1M-parameter model), so the
checks are on names and argument keys, which hold with margin."""
import json

import openai
import pytest

from swift.dataset.tool_calls import TOOLS
from tests.built import built, key_of
from tests.conftest import build_cache
from tests.deploy.serving import deploy

TRAIN = ["--model", "builtin:tiny-chat", "--template", "chatml", "--dataset", "builtin:tool-calls", "--tuner_type",
         "full", "--max_steps", "150", "--per_device_train_batch_size", "8", "--learning_rate", "5e-3",
         "--adam_beta2", "0.98", "--warmup_ratio", "0.05", "--gradient_checkpointing", "false", "--seed", "42",
         "--save_strategy", "no", "--add_version", "false", "--report_to", "none", "--disable_tqdm", "true"]


@pytest.fixture(scope="module")
def server(request):
    from swift import sft_main

    def build(out):
        sft_main([*TRAIN, "--output_dir", str(out / "model")])

    trained = built(build_cache(request.config), "tool-calls", key_of(*TRAIN), build)
    with deploy("--model", str(trained / "model"), "--template", "chatml", "--served_model_name", "tools") as base:
        yield openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)


def ask(c, question, **kw):
    return c.chat.completions.create(model="tools", messages=[{"role": "user", "content": question}], tools=TOOLS,
                                     max_tokens=48, temperature=0, **kw)


def test_the_model_calls_tools_and_the_server_parses_them(server):
    r = ask(server, "What is the weather in Paris?")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"city"}
    r = ask(server, "Add 4 and 9.")
    assert [(t.function.name, set(json.loads(t.function.arguments))) for t in r.choices[0].message.tool_calls] == [
        ("add", {"a", "b"})]
    greeting = ask(server, "Hello!").choices[0]  # no call needed: words, as trained
    assert greeting.finish_reason == "stop" and not greeting.message.tool_calls and greeting.message.content


def test_a_stream_carries_the_calls_as_tool_call_deltas(server):
    plain = ask(server, "Add 4 and 9.").choices[0].message.tool_calls
    chunks = list(ask(server, "Add 4 and 9.", stream=True))
    calls = [t for ch in chunks if ch.choices for t in ch.choices[0].delta.tool_calls or []]
    assert [(t.index, t.function.name, json.loads(t.function.arguments)) for t in calls] == [
        (0, p.function.name, json.loads(p.function.arguments)) for p in plain]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks)  # the call's text is not content
    words = list(ask(server, "Hello!", stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in words) == ask(server, "Hello!").choices[0].message.content


def test_tool_choice_none_required_and_named(server):
    auto = ask(server, "What is the weather in Paris?")
    none = ask(server, "What is the weather in Paris?", tool_choice="none")
    assert none.usage.prompt_tokens < auto.usage.prompt_tokens - 50  # the tools were left out of the prompt
    assert not none.choices[0].message.tool_calls
    named = ask(server, "Add 4 and 9.", tool_choice={"type": "function", "function": {"name": "add"}}).choices[0]
    assert named.message.tool_calls[0].function.name == "add"
    assert set(json.loads(named.message.tool_calls[0].function.arguments)) == {"a", "b"}
    # a greeting is answered in words unless a call is required: then the answer starts as a call (the
    # model writes the rest; decoding is not constrained, so what it writes may not parse)
    words = ask(server, "Hello!").choices[0].message.content
    required = ask(server, "Hello!", tool_choice="required").choices[0]
    assert required.finish_reason == "tool_calls" or (
        required.message.content.startswith("<tool_call>") and words not in required.message.content)


def test_calls_and_results_travel_back(server):
    first = ask(server, "What is the weather in Oslo?").choices[0].message
    history = [{"role": "user", "content": "What is the weather in Oslo?"},
               {"role": "assistant", "content": None,
                "tool_calls": [t.model_dump() for t in first.tool_calls]},
               {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "-3 °C"}]
    r = server.chat.completions.create(model="tools", messages=history, tools=TOOLS, max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens > ask(server, "What is the weather in Oslo?").usage.prompt_tokens


@pytest.mark.parametrize("extra, param", [
    (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(tool_choice="sometimes"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"description": "no name"}}]), "tools"),
    (dict(tools=[{"type": "retrieval"}]), "tools"),
    (dict(messages=[{"role": "user", "content": "x"},
                    {"role": "assistant", "content": None,
                     "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": "{not json"}}]}]),
     "messages"),
])
def test_bad_tool_requests_are_refused_by_name(server, extra, param):
    body = dict(model="tools", messages=[{"role": "user", "content": "Add 4 and 9."}], tools=TOOLS, max_tokens=4)
    body.update(extra)
    with pytest.raises(openai.BadRequestError) as e:
        server.chat.completions.create(**body)
    assert e.value.body["param"] == param


def test_parallel_tool_calls_false_keeps_the_first_call():
    """`parallel_tool_calls: false` (OpenAI: at most one call per answer): an answer with two calls
    comes back with the first only, whole and streamed alike (before 2026-11-29 the field was read
    nowhere)."""
    from swift.deploy import openai_api as api
    from swift.deploy.server import _ToolStream
    from swift.deploy.tools import tool_use
    from swift.infer.protocol import Choice, InferResponse, StreamDelta

    text = ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    answer = InferResponse([Choice(0, text, [], "stop")], 1, 1)
    for parallel, names in ((None, ["add", "get_weather"]), (True, ["add", "get_weather"]), (False, ["add"])):
        body = {"tools": TOOLS, **({} if parallel is None else {"parallel_tool_calls": parallel})}
        use = tool_use(body)
        message = api.chat_response("m", answer, use)["choices"][0]["message"]
        assert [c["function"]["name"] for c in message["tool_calls"]] == names
        chunks = _ToolStream(use).pieces("id", "m", StreamDelta(index=0, text=text, token_ids=[], finish_reason="stop"),
                                         True)
        streamed = [t["function"]["name"] for ch in chunks for t in ch["choices"][0]["delta"].get("tool_calls", [])]
        assert streamed == names
    with pytest.raises(Exception, match="'parallel_tool_calls' must be true or false"):
        tool_use({"tools": TOOLS, "parallel_tool_calls": "no"})

"""The OpenAI contract, field by field: `swift deploy` driven by the official `openai` client and by
raw HTTP, every response and stream chunk checked against the shapes of OpenAI's API reference
(ids, objects, `created`, `model`, choices and their index, message/delta, finish_reason, usage,
log-probs), and the error object of both servers (`swift rollout` answers errors in the same
shape). A field of the wrong type, a missing one, or one the API does not define fails here."""
import json

import openai
import pytest
import requests

from tests.deploy.serving import start, stop

KEY = "sk-conformance"
AUTH = {"Authorization": f"Bearer {KEY}"}
FINISH = {"stop", "length", "tool_calls"}


@pytest.fixture(scope="module")
def servers():
    deploy, d = start("deploy", "--model", "builtin:tiny-chat", "--served_model_name", "tiny", "--api_key", KEY)
    rollout, r = start("rollout", "--model", "builtin:tiny-chat", "--api_key", KEY, health="/health/")
    yield deploy, rollout
    stop(d)
    stop(r)


def exact(obj: dict, required: dict, optional: dict = None, where: str = "") -> None:
    """`obj` has every `required` key, no key outside required+optional, and each value passes its
    check (a type, a tuple of types, or a function)."""
    optional = optional or {}
    assert isinstance(obj, dict), f"{where}: {obj!r} is not an object"
    missing = set(required) - set(obj)
    extra = set(obj) - set(required) - set(optional)
    assert not missing, f"{where}: missing {sorted(missing)}"
    assert not extra, f"{where}: fields the API does not define: {sorted(extra)}"
    for key, check in {**required, **optional}.items():
        if key not in obj:
            continue
        value = obj[key]
        if callable(check) and not isinstance(check, type) and not isinstance(check, tuple):
            assert check(value), f"{where}.{key} = {value!r}"
        else:
            assert isinstance(value, check) and not (isinstance(value, bool) and check in (int, float)), \
                f"{where}.{key} = {value!r} is not {check}"


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def usage(u, where):
    exact(u, {"prompt_tokens": is_int, "completion_tokens": is_int, "total_tokens": is_int}, where=where)
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], where


def top(t, where):
    exact(t, {"token": str, "logprob": float, "bytes": list}, where=where)


def token_logprob(t, where):
    exact(t, {"token": str, "logprob": float, "bytes": list, "top_logprobs": list}, where=where)
    for j, x in enumerate(t["top_logprobs"]):
        top(x, f"{where}.top_logprobs[{j}]")


def chat_logprobs(lp, where):
    if lp is None:
        return
    exact(lp, {"content": list}, {"refusal": lambda v: v is None}, where=where)
    for i, t in enumerate(lp["content"]):
        token_logprob(t, f"{where}.content[{i}]")


# swift's own additions, documented in docs/deploy.md: the token ids of each choice
EXTRA_CHOICE = {"token_ids": lambda v: v is None or all(is_int(t) for t in v)}


def chat_completion(body, n):
    exact(body, {"id": lambda v: isinstance(v, str) and v.startswith("chatcmpl-"),
                 "object": lambda v: v == "chat.completion", "created": is_int, "model": str,
                 "choices": list, "usage": dict}, where="chat.completion")
    assert [c["index"] for c in body["choices"]] == list(range(n))
    for i, c in enumerate(body["choices"]):
        where = f"choices[{i}]"
        exact(c, {"index": is_int, "message": dict, "finish_reason": lambda v: v in FINISH,
                  "logprobs": lambda v: v is None or isinstance(v, dict)}, EXTRA_CHOICE, where=where)
        exact(c["message"], {"role": lambda v: v == "assistant", "content": lambda v: v is None or isinstance(v, str)},
              {"tool_calls": list}, where=f"{where}.message")
        chat_logprobs(c["logprobs"], f"{where}.logprobs")
    usage(body["usage"], "usage")


def chat_chunk(chunk, cid, with_usage):
    exact(chunk, {"id": lambda v: v == cid, "object": lambda v: v == "chat.completion.chunk", "created": is_int,
                  "model": str, "choices": list}, {"usage": lambda v: v is None or isinstance(v, dict)},
          where="chunk")
    assert ("usage" in chunk) == with_usage
    for c in chunk["choices"]:
        exact(c, {"index": is_int, "delta": dict, "finish_reason": lambda v: v is None or v in FINISH,
                  "logprobs": lambda v: v is None or isinstance(v, dict)}, where="chunk.choices[]")
        exact(c["delta"], {}, {"role": lambda v: v == "assistant", "content": lambda v: v is None or isinstance(v, str),
                               "tool_calls": list}, where="chunk.delta")
        chat_logprobs(c["logprobs"], "chunk.logprobs")


def completion(body, n):
    exact(body, {"id": lambda v: isinstance(v, str) and v.startswith("cmpl-"),
                 "object": lambda v: v == "text_completion", "created": is_int, "model": str, "choices": list,
                 "usage": dict}, where="text_completion")
    assert [c["index"] for c in body["choices"]] == list(range(n))
    for i, c in enumerate(body["choices"]):
        exact(c, {"index": is_int, "text": str, "finish_reason": lambda v: v in FINISH,
                  "logprobs": lambda v: v is None or isinstance(v, dict)}, EXTRA_CHOICE, where=f"choices[{i}]")
        if c["logprobs"] is not None:
            exact(c["logprobs"], {"tokens": list, "token_logprobs": list, "top_logprobs": list, "text_offset": list},
                  where=f"choices[{i}].logprobs")
            lengths = {len(v) for v in c["logprobs"].values()}
            assert len(lengths) == 1, c["logprobs"]
    usage(body["usage"], "usage")


def error_object(response, status, param=None):
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    exact(body, {"error": dict}, where="error body")
    exact(body["error"], {"message": lambda v: isinstance(v, str) and v, "type": str,
                          "param": lambda v: v is None or isinstance(v, str),
                          "code": lambda v: v is None or isinstance(v, str)}, where="error")
    assert body["error"]["type"] == ("invalid_request_error" if status < 500 else "server_error")
    if param is not None:
        assert body["error"]["param"] == param, body


def test_chat_completions_field_by_field(servers):
    base = servers[0]
    for extra, n in (({}, 1), ({"n": 2, "temperature": 1.0, "seed": 3}, 2), ({"logprobs": True, "top_logprobs": 2}, 1)):
        r = requests.post(base + "/v1/chat/completions", headers=AUTH, timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "12+34="}], "max_tokens": 5, **extra})
        chat_completion(r.json(), n)
    # the official client reads the same body without complaint
    c = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
    parsed = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert parsed.object == "chat.completion" and parsed.usage.total_tokens > 0


def test_chat_stream_chunks_field_by_field(servers):
    base = servers[0]
    for options in (None, {"include_usage": True}):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "12+34="}], "max_tokens": 6, "n": 2,
                "temperature": 1.0, "stream": True, "logprobs": True}
        if options:
            body["stream_options"] = options
        with requests.post(base + "/v1/chat/completions", headers=AUTH, json=body, stream=True, timeout=60) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in r.iter_lines(decode_unicode=True) if line]
        assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in lines[:-1]]
        cid = chunks[0]["id"]
        for chunk in chunks:
            chat_chunk(chunk, cid, with_usage=bool(options))
        first = {}
        for chunk in chunks:
            for c in chunk["choices"]:
                first.setdefault(c["index"], c["delta"])
        assert sorted(first) == [0, 1] and all(d.get("role") == "assistant" for d in first.values())
        finished = [c["index"] for ch in chunks for c in ch["choices"] if c["finish_reason"]]
        assert sorted(finished) == [0, 1]  # each choice ends exactly once
        if options:
            assert chunks[-1]["choices"] == [] and usage(chunks[-1]["usage"], "last chunk") is None


def test_completions_and_models_field_by_field(servers):
    base = servers[0]
    for extra, n in (({}, 1), ({"prompt": ["1+1=", "2+2="], "n": 2, "temperature": 1.0}, 4),
                     ({"logprobs": 2, "echo": True}, 1)):
        r = requests.post(base + "/v1/completions", headers=AUTH, timeout=60,
                          json={"model": "tiny", "prompt": "12+34=", "max_tokens": 4, **extra})
        completion(r.json(), n)
    with requests.post(base + "/v1/completions", headers=AUTH, stream=True, timeout=60,
                       json={"model": "tiny", "prompt": "12+34=", "max_tokens": 4, "stream": True}) as r:
        lines = [line for line in r.iter_lines(decode_unicode=True) if line]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        chunk = json.loads(line[6:])
        exact(chunk, {"id": str, "object": lambda v: v == "text_completion", "created": is_int, "model": str,
                      "choices": list}, where="completion chunk")
        for c in chunk["choices"]:
            exact(c, {"index": is_int, "text": str, "finish_reason": lambda v: v is None or v in FINISH,
                      "logprobs": lambda v: v is None or isinstance(v, dict)}, where="completion chunk.choices[]")
    models = requests.get(base + "/v1/models", headers=AUTH, timeout=60).json()
    exact(models, {"object": lambda v: v == "list", "data": list}, where="models")
    for m in models["data"]:
        exact(m, {"id": str, "object": lambda v: v == "model", "created": is_int, "owned_by": str}, where="model")


@pytest.mark.parametrize("server, path, body, status, param", [
    ("deploy", "/v1/chat/completions", {"model": "tiny", "messages": []}, 400, "messages"),
    ("deploy", "/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ("deploy", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 1.5},
     400, "n"),
    ("deploy", "/v1/completions", {"model": "tiny", "prompt": ""}, 400, "prompt"),
    ("deploy", "/v1/nowhere", {}, 404, None),
    ("rollout", "/infer/", {"infer_requests": []}, 400, "infer_requests"),
    ("rollout", "/infer/", {"infer_requests": [{"messages": [{"role": "user", "content": "x"}]}],
                            "request_config": {"n": "2"}}, 400, "request_config.n"),
    ("rollout", "/generate/", {"prompts": [[999999999]]}, 400, "prompts"),
    ("rollout", "/reset_prefix_cache/", {}, 409, None),
    ("rollout", "/nowhere/", {}, 404, None),
])
def test_errors_have_the_openai_error_shape_on_both_servers(servers, server, path, body, status, param):
    base = servers[0] if server == "deploy" else servers[1]
    error_object(requests.post(base + path, headers=AUTH, json=body, timeout=60), status, param)
    error_object(requests.post(base + path, json=body, timeout=60), 401)  # no key


def test_rollout_responses_field_by_field(servers):
    base = servers[1]
    r = requests.post(base + "/infer/", headers=AUTH, timeout=60, json={
        "infer_requests": [{"messages": [{"role": "user", "content": "1+1="}]}],
        "request_config": {"max_tokens": 4, "n": 2, "temperature": 1.0, "logprobs": True}}).json()
    assert isinstance(r, list) and len(r) == 1 and len(r[0]["choices"]) == 2
    for t in r[0]["choices"]:
        assert isinstance(t["message"], dict) and t["message"]["role"] == "assistant"
        assert isinstance(t["message"]["content"], str) and t["finish_reason"] in ("stop", "length")
        assert len(t["response_token_ids"]) == len(t["response_loss_mask"]) == len(t["logprobs"])
        assert all(is_int(x) for x in t["prompt_ids"] + t["completion_ids"])
    g = requests.post(base + "/generate/", headers=AUTH, timeout=60,
                      json={"prompts": ["1+1=", [15, 27]], "max_tokens": 3, "n": 2}).json()
    exact(g, {"prompt_ids": list, "completion_ids": list, "logprobs": list}, where="/generate/")
    assert len(g["prompt_ids"]) == 2 and len(g["completion_ids"]) == len(g["logprobs"]) == 4
    assert all(len(c) == len(lp) for c, lp in zip(g["completion_ids"], g["logprobs"]))

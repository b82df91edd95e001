"""`swift deploy` and `swift rollout` facing a hostile network: every kind of bad request gets a 4xx
JSON error while well-formed traffic keeps flowing without a single error, the weight-sync
communicator belongs to the trainer that opened it, and a soak with clients that walk away leaks
nothing."""
import asyncio
import json
import os
import threading
import time

import openai
import pytest
import requests
import torch

from swift.model import load_model
from swift.rollout.client import RolloutClient
from swift.utils.registry import SwiftError
from tests.deploy.serving import rss_bytes, start, stop

KEY = "sk-hostile"
SLOW_DECODE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins", "slow_decode.py")
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_BYTES = 65536


@pytest.fixture(scope="module")
def deploy_server():
    # a fresh process: the soak test measures its memory
    base, proc = start("deploy", "--model", "builtin:tiny-chat", "--served_model_name", "tiny", "--api_key", KEY,
                       "--max_request_bytes", str(MAX_BYTES), "--max_n", "8", "--max_tokens_limit", "64", fresh=True)
    yield base, proc
    stop(proc)


@pytest.fixture(scope="module")
def rollout_server():
    base, proc = start("rollout", "--model", "builtin:tiny-chat", "--api_key", KEY, "--multi_turn_scheduler", "gym",
                       "--max_turns", "2", "--max_request_bytes", str(MAX_BYTES), "--max_n", "8",
                       "--max_rows_per_request", "64", health="/health/")
    yield base, proc
    stop(proc)


def chat(**extra):
    return {"model": "tiny", "messages": [{"role": "user", "content": "12+34="}], "max_tokens": 4, **extra}


def infer(env="guess_number", **config):
    return {"infer_requests": [{"messages": [{"role": "user", "content": "Guess a number."}],
                                "data_dict": {"env": env, "solution": 7}}],
            "request_config": {"max_tokens": 4, **config}}


def chunked(size):
    for _ in range(size // 8192 + 1):
        yield b" " * 8192


# (server, path, what is sent, expected status); "json" is encoded as is, "data" is sent raw
BAD_REQUESTS = [
    ("deploy", "/v1/chat/completions", dict(data=b"{not json"), 400),
    ("deploy", "/v1/chat/completions", dict(data=b"[1, 2, 3]"), 400),
    ("deploy", "/v1/chat/completions", dict(data=b"\xff\xfe\xfa{}"), 400),  # broken unicode
    ("deploy", "/v1/chat/completions", dict(data=b"[" * 30000 + b"]" * 30000), 400),  # nested too deeply
    ("deploy", "/v1/chat/completions", dict(json=chat(), headers={}), 401),
    ("deploy", "/v1/chat/completions", dict(json=chat(), headers={"Authorization": "Bearer sk-wrong"}), 401),
    ("deploy", "/v1/models", dict(headers={"Authorization": f"bearer {KEY}"}), 401),
    ("deploy", "/v1/chat/completions", dict(data=b"{" + b" " * (MAX_BYTES + 10) + b"}"), 413),
    ("deploy", "/v1/chat/completions", dict(data=chunked(MAX_BYTES + 10)), 413),  # no Content-Length
    ("deploy", "/v1/chat/completions", dict(json={"model": "tiny", "messages": "hi"}), 400),
    ("deploy", "/v1/chat/completions", dict(json={"model": "tiny", "messages": []}), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(messages=[{"role": "wizard", "content": "hi"}])), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(messages=[{"role": "user", "content": 5}])), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(max_tokens=-3)), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(max_tokens="4")), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(max_tokens=65)), 400),  # above --max_tokens_limit
    ("deploy", "/v1/chat/completions", dict(data=json.dumps(chat(temperature=0.5)).replace("0.5", "NaN").encode()),
     400),
    ("deploy", "/v1/chat/completions", dict(json=chat(top_p=0)), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(n=0)), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(n=9)), 400),  # above --max_n
    ("deploy", "/v1/chat/completions", dict(json=chat(logprobs=True, top_logprobs=50)), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(seed=2 ** 80)), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(stop=[1, 2])), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(tools="rm -rf /")), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(stop=[str(i) for i in range(17)])), 400),  # too many stops
    ("deploy", "/v1/chat/completions", dict(json=chat(stop=["x" * 300])), 400),
    ("deploy", "/v1/chat/completions", dict(data=json.dumps(chat(max_tokens=7)).replace("7", "Infinity").encode()),
     400),
    ("deploy", "/v1/chat/completions", dict(data=json.dumps(chat(seed=7)).replace("7", "9" * 5000).encode()), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(repetition_penalty=0)), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(model="gpt-5")), 404),
    # strict types, never coerced; OpenAI fields this server does not implement are refused by name
    ("deploy", "/v1/chat/completions", dict(json=chat(n=1.7)), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(logprobs="no")), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(stream="false")), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(stop=[""])), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(logit_bias={"x": 100})), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(logit_bias={"5": 101})), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(logit_bias={"99999999": 1})), 400),  # not in the vocabulary
    ("deploy", "/v1/chat/completions", dict(json=chat(logit_bias=[5])), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(presence_penalty=2.5)), 400),
    # the tiny model's own chat_template renders no tools: refused, never dropped in silence
    ("deploy", "/v1/chat/completions", dict(json=chat(tools=[{"type": "function", "function": {"name": "f"}}])), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(frequency_penalty="0.5")), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(response_format={"type": "json_object"})), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(stream_options={"include_usage": True})), 400),  # no stream
    ("deploy", "/v1/chat/completions", dict(json=chat(stream=True, stream_options={"include_usage": "yes"})), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(tool_choice="required")), 400),
    # OpenAI fields this server would otherwise ignore
    ("deploy", "/v1/chat/completions", dict(json=chat(modalities=["text", "audio"])), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(audio={"voice": "alloy", "format": "wav"})), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(reasoning_effort="low")), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(min_p=0.9)), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(prediction={"type": "content", "content": "x"})), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(web_search_options={})), 400),
    ("deploy", "/v1/completions", dict(json={"model": "tiny", "prompt": "1+1=", "max_tokens": 2, "best_of": 3}), 400),
    ("deploy", "/v1/completions", dict(json={"model": "tiny", "prompt": "1+1=", "max_tokens": 2, "suffix": "x"}), 400),
    ("deploy", "/v1/chat/completions", dict(json=chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])),
     400),
    ("deploy", "/v1/completions", dict(json={"model": "tiny", "prompt": [5, 999999], "max_tokens": 4}), 400),
    ("deploy", "/v1/completions", dict(json={"model": "tiny", "prompt": [5, -1], "max_tokens": 4}), 400),
    ("deploy", "/v1/completions", dict(json={"model": "tiny", "prompt": [5] * 600, "max_tokens": 4}), 400),
    ("deploy", "/v1/completions", dict(json={"model": "tiny", "prompt": [5, 999999], "max_tokens": 4,
                                             "stream": True}), 400),
    ("deploy", "/v1/rewards", dict(json={"input": ["a"]}), 400),  # a generative model has no reward route
    ("deploy", "/v1/no_such_route", dict(json={}), 404),
    ("rollout", "/infer/", dict(json=infer(), headers={}), 401),
    ("rollout", "/generate/", dict(json={"prompts": ["1+1="]}, headers={"Authorization": "Bearer nope"}), 401),
    ("rollout", "/infer/", dict(json=infer(env="os:getpid")), 400),  # request data never picks code to import
    ("rollout", "/infer/", dict(json=infer(env="os:abort")), 400),
    ("rollout", "/infer/", dict(json=infer(env="no_such_env")), 400),
    ("rollout", "/infer/", dict(json=infer(env=["guess_number"])), 400),
    ("rollout", "/infer/", dict(json={"infer_requests": [{"messages": [{"role": "user", "content": "x"}],
                                                          "data_dict": "env=os:abort"}]}), 400),
    ("rollout", "/infer/", dict(json={"infer_requests": {"messages": []}}), 400),
    ("rollout", "/infer/", dict(json=infer(n=True)), 400),
    ("rollout", "/infer/", dict(json=infer(max_tokens=5.5)), 400),
    ("rollout", "/infer/", dict(json=infer(n=9)), 400),
    ("rollout", "/infer/", dict(data=b"\x00\x01garbage"), 400),
    ("rollout", "/infer/", dict(data=b"{" + b" " * (MAX_BYTES + 10) + b"}"), 413),
    ("rollout", "/generate/", dict(json={"prompts": [[5, 999999]], "max_tokens": 4}), 400),
    ("rollout", "/generate/", dict(json={"prompts": [[5, -7]], "max_tokens": 4}), 400),
    ("rollout", "/generate/", dict(json={"prompts": [[5] * 600], "max_tokens": 4}), 400),
    ("rollout", "/generate/", dict(json={"prompts": [[True, False]], "max_tokens": 4}), 400),
    ("rollout", "/generate/", dict(json={"prompts": ["1+1="] * 9, "n": 8, "max_tokens": 4}), 400),  # > 64 rows
    ("rollout", "/init_communicator/", dict(json={"host": "127.0.0.1", "port": 29555}, headers={}), 401),
    ("rollout", "/init_communicator/", dict(json={"host": "10.9.8.7", "port": 29555}), 403),  # not the caller
    ("rollout", "/init_communicator/", dict(json={"host": "127.0.0.1", "port": "29555"}), 400),
    ("rollout", "/init_communicator/", dict(json={"host": "127.0.0.1", "port": 29555, "world_size": 7}), 400),
    ("rollout", "/init_communicator/", dict(json={"host": "127.0.0.1", "port": 29555, "timeout": -1}), 400),
    ("rollout", "/update_flattened_params/", dict(json={"metadatas": []}), 409),  # nobody holds it
    ("rollout", "/close_communicator/", dict(json={}), 409),
    ("rollout", "/reset_prefix_cache/", dict(json={}), 409),
]


class Traffic:
    """Well-formed requests to both servers, one after another on a thread, counting every answer
    that is not a 200."""

    def __init__(self, deploy_base, rollout_base):
        self.calls = [
            (deploy_base + "/v1/chat/completions", chat(temperature=0.7)),
            (deploy_base + "/v1/completions", {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4}),
            (rollout_base + "/infer/", infer(n=2, temperature=1.0)),
            (rollout_base + "/generate/", {"prompts": ["1+1=", [5, 6]], "n": 2, "max_tokens": 4}),
        ]
        self.done, self.errors = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for url, body in self.calls:
                try:
                    r = requests.post(url, json=body, headers=AUTH, timeout=120)
                    ok = r.status_code == 200 and "error" not in (r.json() if isinstance(r.json(), dict) else {})
                except Exception as e:  # noqa: BLE001 - any failure counts
                    ok, r = False, e
                if ok:
                    self.done += 1
                else:
                    self.errors.append(f"{url}: {getattr(r, 'status_code', r)} {getattr(r, 'text', '')[:200]}")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(180)


def send(base, path, how):
    how = dict(how)
    headers = how.pop("headers", AUTH)
    if "json" not in how and "data" not in how:
        return requests.get(base + path, headers=headers, timeout=60)
    if "data" in how and isinstance(how["data"], bytes):
        headers = {**headers, "Content-Type": "application/json"}
    return requests.post(base + path, headers=headers, timeout=60, **how)


def test_bad_requests_get_4xx_json_while_good_traffic_flows(deploy_server, rollout_server):
    bases = {"deploy": deploy_server[0], "rollout": rollout_server[0]}
    wrong = []
    with Traffic(bases["deploy"], bases["rollout"]) as traffic:
        for server, path, how, status in BAD_REQUESTS:
            r = send(bases[server], path, how)
            try:
                message = r.json()["error"]["message"]
            except Exception:  # noqa: BLE001
                message = None
            if r.status_code != status or not message:
                wrong.append(f"{server} {path} {str(how)[:80]}: {r.status_code} {r.text[:200]}")
        ownership_cases(bases["rollout"], wrong)
        time.sleep(1)  # let the good traffic overlap the last bad requests
    assert not wrong, "\n".join(wrong)
    assert not traffic.errors, traffic.errors[:3]
    assert traffic.done >= 8
    assert len(BAD_REQUESTS) >= 60
    for base, health in ((bases["deploy"], "/health"), (bases["rollout"], "/health/")):
        assert requests.get(base + health).status_code == 200  # os:abort never ran; everything still serves


def ownership_cases(base, wrong):
    """The communicator belongs to the trainer that opened it."""
    port = int(base.rsplit(":", 1)[1])
    model, _, _ = load_model("builtin:tiny-chat")
    with pytest.raises(SwiftError, match="401"):
        RolloutClient(port=port, timeout=60)  # a trainer without the key gets nowhere
    holder = RolloutClient(port=port, timeout=60, api_key=KEY)
    holder.sync_weights(model)  # a real sync with the key and the session token
    token = holder.session.headers["X-Session-Token"]

    def expect(status, path, body, headers):
        r = requests.post(base + path, json=body, headers={**AUTH, **headers}, timeout=60)
        if r.status_code != status or "error" not in r.json():
            wrong.append(f"ownership {path} {headers}: {r.status_code} {r.text[:200]}")

    norm = {"name": "model.norm.weight", "dtype": "float32", "shape": [128]}
    expect(409, "/init_communicator/", {"host": "127.0.0.1", "port": 29556}, {})  # a second trainer
    expect(403, "/close_communicator/", {}, {})  # closing without the token
    expect(403, "/close_communicator/", {}, {"X-Session-Token": "guess"})
    expect(403, "/update_named_param/", norm, {"X-Session-Token": token[:-1]})
    expect(403, "/reset_prefix_cache/", {}, {})
    expect(400, "/update_named_param/", {**norm, "dtype": "int8"}, {"X-Session-Token": token})
    expect(400, "/update_named_param/", {**norm, "shape": [127]}, {"X-Session-Token": token})
    expect(400, "/update_named_param/", {**norm, "shape": [-128]}, {"X-Session-Token": token})
    expect(400, "/update_flattened_params/", {"metadatas": [{**norm, "start_idx": 5, "end_idx": 133, "numel": 128}]},
           {"X-Session-Token": token})
    expect(400, "/update_flattened_params/", {"metadatas": [{**norm, "start_idx": "0", "end_idx": 128}]},
           {"X-Session-Token": token})
    # the holder is undisturbed by all of that: it syncs again, then leaves, and another trainer may join
    with torch.no_grad():
        next(model.parameters()).add_(0.01)
    holder.sync_weights(model)
    holder.close()
    other = RolloutClient(port=port, timeout=60, api_key=KEY)
    other.sync_weights(model)
    other.close()


def test_limits_429_and_timeouts():
    """A concurrency cap answers 429, and a request that runs past --request_timeout gets 504 (a
    stream: an error event, then [DONE]); the engine is left with nothing queued or running."""
    from swift.serving.guard import ServingLimits
    from swift.deploy.server import create_app
    from swift.infer.transformers_engine import TransformersEngine
    from swift.template import get_template
    from tests.deploy.serving import serve_in_thread

    model, tokenizer, _ = load_model("builtin:tiny-chat")
    forward = model.forward

    def slow_forward(*args, **kwargs):
        time.sleep(0.02)
        return forward(*args, **kwargs)

    model.forward = slow_forward
    engine = TransformersEngine(model, tokenizer, get_template("jinja", tokenizer), fast_decode=False)
    app = create_app("tiny", engine=engine, limits=ServingLimits(max_concurrent_requests=2, request_timeout=1.5))
    body = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "max_tokens": 300, "temperature": 1.0,
            "seed": 1}
    try:
        with serve_in_thread(app) as base:
            streams = [requests.post(base + "/v1/chat/completions", json={**body, "stream": True}, stream=True,
                                     timeout=60) for _ in range(2)]
            refused = requests.post(base + "/v1/chat/completions", json=body, timeout=60)
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_requests"
            events = [[line for line in s.iter_lines() if line] for s in streams]
            for lines in events:  # each stream ran out of time: an error event, then [DONE]
                assert lines[-1] == b"data: [DONE]"
                assert json.loads(lines[-2][len(b"data: "):])["error"]["code"] == "timeout"
            late = requests.post(base + "/v1/chat/completions", json=body, timeout=60)
            assert late.status_code == 504 and late.json()["error"]["code"] == "timeout"
            deadline = time.time() + 10
            while requests.get(base + "/health").json() != {"status": "ok", "requests_in_flight": 0, "queued": 0,
                                                          "running": 0}:
                assert time.time() < deadline, requests.get(base + "/health").json()
                time.sleep(0.1)
    finally:
        engine.close()


def test_a_client_that_leaves_a_plain_request_stops_its_generation():
    """A non-streamed chat whose client disconnects mid-generation: its rows leave the batch within
    a few decode steps (before: it ran to max_tokens, 300 steps here, for nobody), and the next
    request is answered at once."""
    import http.client

    from swift.deploy.server import create_app
    from swift.infer.transformers_engine import TransformersEngine
    from swift.template import get_template
    from tests.deploy.serving import serve_in_thread

    model, tokenizer, _ = load_model("builtin:tiny-chat")
    forward, steps = model.forward, [0]

    def slow_forward(*args, **kwargs):  # ≥ 20 ms a step: 300 steps take ≥ 6 s on any CPU
        steps[0] += 1
        time.sleep(0.02)
        return forward(*args, **kwargs)

    model.forward = slow_forward
    engine = TransformersEngine(model, tokenizer, get_template("jinja", tokenizer), fast_decode=False)
    engine.eos_ids = set()  # every row runs to max_tokens unless it is stopped
    body = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "max_tokens": 300, "temperature": 1.0}
    try:
        with serve_in_thread(create_app("tiny", engine=engine)) as base:
            host, port = base.rsplit("/", 1)[1].split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
            deadline = time.time() + 30
            while requests.get(base + "/health").json()["running"] == 0:  # it is being generated
                assert time.time() < deadline
                time.sleep(0.02)
            time.sleep(0.2)
            conn.close()  # the client leaves
            at_close = steps[0]
            deadline = time.time() + 30
            while requests.get(base + "/health").json() != {"status": "ok", "requests_in_flight": 0, "queued": 0,
                                                          "running": 0}:
                assert time.time() < deadline
                time.sleep(0.02)
            assert steps[0] - at_close <= 10, steps[0] - at_close  # stopped within a few decode steps
            start_next = time.time()
            r = requests.post(base + "/v1/chat/completions", json={**body, "max_tokens": 4}, timeout=60)
            assert r.status_code == 200 and time.time() - start_next < 5
    finally:
        engine.close()


def test_an_unexpected_failure_is_a_500_without_its_text():
    """An engine failure that is not the request's: the client gets the exception's type and an
    incident id, never its message (here a file path); the log has the rest under the same id."""
    from swift.deploy.server import create_app
    from swift.infer.transformers_engine import TransformersEngine
    from swift.template import get_template
    from tests.deploy.serving import serve_in_thread

    model, tokenizer, _ = load_model("builtin:tiny-chat")
    engine = TransformersEngine(model, tokenizer, get_template("jinja", tokenizer))

    async def broken(request, config):
        raise OSError("/srv/secret/weights/model.safetensors: read failed")

    engine.infer_async = broken
    try:
        with serve_in_thread(create_app("tiny", engine=engine)) as base:
            r = requests.post(base + "/v1/chat/completions", json=chat(), timeout=60)
            assert r.status_code == 500
            error = r.json()["error"]
            assert error["type"] == "server_error" and error["code"] == "internal_error"
            assert "OSError" in error["message"] and "incident" in error["message"]
            assert "/srv" not in r.text and "safetensors" not in r.text
    finally:
        engine.close()


def test_half_sent_bodies_hold_no_slot():
    """As many clients as --max_concurrent_requests send headers and half a body, then stall: a
    well-formed request is still answered (before: 429 until the stalled ones timed out, up to 610 s),
    and each stalled one gets 408 after --body_timeout."""
    import http.client
    import socket

    from swift.serving.guard import ServingLimits
    from swift.deploy.server import create_app
    from swift.infer.transformers_engine import TransformersEngine
    from swift.template import get_template
    from tests.deploy.serving import serve_in_thread

    model, tokenizer, _ = load_model("builtin:tiny-chat")
    engine = TransformersEngine(model, tokenizer, get_template("jinja", tokenizer))
    app = create_app("tiny", engine=engine, limits=ServingLimits(max_concurrent_requests=2, body_timeout=3))
    body = json.dumps(chat()).encode()
    try:
        with serve_in_thread(app) as base:
            host, port = base.rsplit("/", 1)[1].split(":")
            stalled = []
            for _ in range(2):
                sock = socket.create_connection((host, int(port)), timeout=30)
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body) + body[:len(body) // 2])
                stalled.append(sock)
            time.sleep(0.5)
            started = time.time()
            r = requests.post(base + "/v1/chat/completions", json=chat(), timeout=30)
            assert r.status_code == 200, r.text
            for sock in stalled:  # 408 once --body_timeout has passed
                answer = http.client.HTTPResponse(sock)
                answer.begin()
                assert answer.status == 408
                assert json.loads(answer.read())["error"]["code"] == "request_timeout"
                sock.close()
            assert time.time() - started < 20
    finally:
        engine.close()


def test_bodies_being_read_are_capped_together():
    """The bodies read before their requests take a slot hold at most --max_concurrent_requests ×
    --max_request_bytes bytes together: past that a new request gets 429, one that fits is served."""
    import http.client
    import socket

    from swift.serving.guard import ServingLimits
    from swift.deploy.server import create_app
    from swift.infer.transformers_engine import TransformersEngine
    from swift.template import get_template
    from tests.deploy.serving import serve_in_thread

    model, tokenizer, _ = load_model("builtin:tiny-chat")
    engine = TransformersEngine(model, tokenizer, get_template("jinja", tokenizer))
    limits = ServingLimits(max_concurrent_requests=1, max_request_bytes=1000, body_timeout=5)
    compact = json.dumps(chat()).encode()
    try:
        with serve_in_thread(create_app("tiny", engine=engine, limits=limits)) as base:
            host, port = base.rsplit("/", 1)[1].split(":")
            sock = socket.create_connection((host, int(port)), timeout=30)  # 900 of its 1000 bytes, then stalls
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n" + b" " * 900)
            time.sleep(0.5)
            padded = compact[:-1] + b" " * (300 - len(compact)) + b"}"
            r = requests.post(base + "/v1/chat/completions", data=padded, timeout=30,
                              headers={"Content-Type": "application/json"})
            assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_requests", r.text
            r = requests.post(base + "/v1/chat/completions", data=compact, timeout=30,
                              headers={"Content-Type": "application/json"})
            assert r.status_code == 200, r.text
            answer = http.client.HTTPResponse(sock)
            answer.begin()
            assert answer.status == 408
            sock.close()
    finally:
        engine.close()


def test_soak_1000_requests_with_walkaways(deploy_server):
    """1,000 streamed chats at concurrency 32; every fifth client reads one chunk and disconnects.
    The clients that stay get no error; at the end nothing is queued, running or in flight, and the
    server's RSS grew less than 10% over a warmed-up start."""
    base, proc = deploy_server

    async def run(count):
        c = openai.AsyncOpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=120)
        gate = asyncio.Semaphore(32)

        async def one(i):
            async with gate:
                walk = i % 5 == 0
                stream = await c.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": f"{i}+{i}="}], stream=True,
                    max_tokens=48 if walk else 8, temperature=1.0, seed=i)
                text, reason = "", None
                async for chunk in stream:
                    text += chunk.choices[0].delta.content or ""
                    reason = chunk.choices[0].finish_reason or reason
                    if walk:
                        break
                await stream.close()
                return walk or reason in ("stop", "length")

        out = await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)
        await c.close()
        return out

    asyncio.run(run(100))  # warm-up: allocator pools, batch shapes
    before = rss_bytes(proc.pid)
    results = asyncio.run(run(1000))
    errors = [r for r in results if r is not True]
    assert not errors, errors[:3]
    deadline = time.time() + 15
    while (h := requests.get(base + "/health").json()) != {"status": "ok", "requests_in_flight": 0, "queued": 0,
                                                          "running": 0}:
        assert time.time() < deadline, h
        time.sleep(0.2)
    after = rss_bytes(proc.pid)
    assert after < 1.10 * before, (before, after)


def test_a_rollout_job_stops_at_its_deadline_or_when_its_client_leaves():
    """A /generate/ or /infer/ that outlives --request_timeout gets 504 and a client that leaves gets
    nothing, and in both cases the worker stops the job between decode steps: the request queued
    next is answered on time (before 2026-11-27 the worker ran the abandoned job to its end, ≥ 12 s
    here, and the requests behind it got 504 too)."""
    import http.client

    # 240 tokens: ≥ 12 s of decoding on any CPU, as no row ends early
    env = {**os.environ, "SWIFT_TEST_STEP_SECONDS": "0.05", "SWIFT_TEST_NO_EOS": "1"}
    base, proc = start("rollout", "--model", "builtin:tiny-chat", "--request_timeout", "3", "--external_plugins",
                       SLOW_DECODE, "--multi_turn_scheduler", "gym", "--max_turns", "1", health="/health/", env=env)
    heavy = {"prompts": ["1+1=", "2+2="], "n": 2, "max_tokens": 240, "temperature": 1.0, "seed": 0}
    light = {"prompts": ["1+1="], "max_tokens": 2}

    def served_on_time():
        begin = time.time()
        r = requests.post(base + "/generate/", json=light, timeout=60)
        assert r.status_code == 200, r.text  # within its own 3 s: nothing of the stopped job is left ahead of it
        assert len(r.json()["completion_ids"]) == 1 and time.time() - begin < 3

    try:
        r = requests.post(base + "/generate/", json=heavy, timeout=60)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        served_on_time()
        r = requests.post(base + "/infer/", json=infer(max_tokens=240, temperature=1.0), timeout=60)
        assert r.status_code == 504, r.text  # a multi-turn job stops alike
        served_on_time()
        host, port = base.rsplit("/", 1)[1].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/generate/", json.dumps(heavy), {"Content-Type": "application/json"})
        time.sleep(1.0)  # it is being generated
        conn.close()  # the client leaves
        served_on_time()
        assert requests.get(base + "/health/").status_code == 200
    finally:
        stop(proc)


def test_a_store_that_is_not_there_does_not_stall_generation():
    """/init_communicator/ naming a store nobody hosts, with the longest timeout a client may ask:
    the timeout is capped at --weight_sync_timeout, generation goes on while the workers try to
    form the group (before 2026-11-27 it answered 504 until the client's timeout ran out), and the
    failure reaches the holder as a 409 naming it."""
    from tests.deploy.serving import free_port

    base, proc = start("rollout", "--model", "builtin:tiny-chat", "--api_key", KEY, "--weight_sync_timeout", "3",
                       health="/health/")
    try:
        r = requests.post(base + "/init_communicator/", json={"host": "127.0.0.1", "port": free_port(),
                                                              "timeout": 3600}, headers=AUTH, timeout=60)
        assert r.status_code == 200 and r.json()["timeout"] == 3
        token = {"X-Session-Token": r.json()["session_token"]}
        begin = time.time()
        g = requests.post(base + "/generate/", json={"prompts": ["1+1="], "max_tokens": 2}, headers=AUTH, timeout=60)
        assert g.status_code == 200 and time.time() - begin < 3  # served while the group is forming
        norm = {"name": "model.norm.weight", "dtype": "float32", "shape": [128]}
        assert requests.post(base + "/update_named_param/", json=norm, headers={**AUTH, **token},
                             timeout=60).status_code == 200  # the bucket waits for the group, which fails
        deadline = time.time() + 60
        while True:
            r = requests.post(base + "/reset_prefix_cache/", json={}, headers={**AUTH, **token}, timeout=60)
            if r.status_code == 409:
                break
            assert r.status_code == 200 and time.time() < deadline, r.text
            time.sleep(0.5)
        assert "could not form" in r.json()["error"]["message"]
        g = requests.post(base + "/generate/", json={"prompts": ["1+1="], "max_tokens": 2}, headers=AUTH, timeout=60)
        assert g.status_code == 200
    finally:
        stop(proc)

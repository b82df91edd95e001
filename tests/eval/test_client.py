"""The client engine (`--eval_url`, `--sampler_engine client`) against a stand-in OpenAI server: it
keeps as many requests in flight as asked (not the 6 threads of asyncio's default pool on a 2-core
machine), and a malformed answer fails its own request only."""
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from swift.infer.client import ClientEngine
from swift.infer.protocol import InferRequest, RequestConfig
from swift.pipelines.eval import generate


class Handler(BaseHTTPRequestHandler):
    in_flight = peak = 0
    target, hold = 1, 5.0
    status = 200  # of every POST, 0: closed unanswered (the questions "refuse" and "fail" get 400 and 500)
    arrived = threading.Condition()

    def log_message(self, *args):
        pass

    def answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.answer({"object": "list", "data": [{"id": "stand-in"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        with cls.arrived:  # hold each request until `target` are in flight at once (or 5 s pass)
            cls.in_flight += 1
            cls.peak = max(cls.peak, cls.in_flight)
            cls.arrived.notify_all()
            cls.arrived.wait_for(lambda: cls.peak >= cls.target, timeout=cls.hold)
        with cls.arrived:
            cls.in_flight -= 1
        question = body["messages"][-1]["content"]
        status = {"refuse": 400, "fail": 500}.get(question, cls.status)
        if status == 0:  # no answer: the connection is closed
            self.close_connection = True
        elif status != 200:
            data = json.dumps({"error": {"message": f"status {status}"}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif question == "malformed":
            self.answer({"choices": "not a list"})
        else:
            self.answer({"choices": [{"index": 0, "message": {"role": "assistant", "content": question.upper()},
                                      "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})


@pytest.fixture()
def server():
    Handler.in_flight = Handler.peak = 0
    Handler.target, Handler.hold, Handler.status = 1, 5.0, 200
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def test_concurrency_as_asked_and_failures_isolated(server):
    # each request is held until all 16 are in flight (at most 30 s: released at once when they are;
    # 5 s was once too short for the client's 16 threads to start on a loaded 2-core machine)
    Handler.target, Handler.hold = 16, 30.0
    engine = ClientEngine(server, concurrency=16)
    try:
        questions = [f"q{i}" for i in range(15)] + ["malformed"]
        requests = [InferRequest(messages=[{"role": "user", "content": q}]) for q in questions]
        responses = generate(engine, requests, RequestConfig(max_tokens=4), True, desc="client")
    finally:
        engine.close()
    assert Handler.peak == 16  # every request in flight at once
    assert [r.choices[0].text for r in responses[:15]] == [q.upper() for q in questions[:15]]
    assert "not an OpenAI completion" in str(responses[15])


def test_concurrency_limit_is_kept(server):
    Handler.target, Handler.hold = 4, 0.5  # never reached: 3 at a time, each released after 0.5 s
    engine = ClientEngine(server, concurrency=3)
    try:
        requests = [InferRequest(messages=[{"role": "user", "content": f"q{i}"}]) for i in range(6)]
        generate(engine, requests, RequestConfig(max_tokens=4), True, desc="client")
    finally:
        engine.close()
    assert Handler.peak == 3


def test_eval_per_sample_files_never_collide(server, tmp_path):
    """Two general_qa files of the same name: two per-sample files, each named in the report."""
    from swift.pipelines.eval import eval_main

    paths = []
    for d, query in (("a", "x"), ("b", "y")):
        (tmp_path / d).mkdir()
        path = tmp_path / d / "test.jsonl"
        path.write_text(json.dumps({"query": query, "response": query.upper()}) + "\n")
        paths.append(str(path))
    report = eval_main(["--eval_url", server, "--eval_dataset", *paths, "--eval_output_dir", str(tmp_path / "out")])
    files = [report["results"][p]["file"] for p in paths]
    assert files == ["test.jsonl", "test-1.jsonl"] and all(report["results"][p]["acc"] == 1.0 for p in paths)
    for p, name in zip(paths, files):
        with open(os.path.join(report["output_dir"], name)) as f:
            assert json.loads(f.readline())["origin"].startswith(p)


def test_eval_with_a_broken_engine_stops_and_leaves_nothing(server, tmp_path, monkeypatch):
    from swift.pipelines.eval import eval_main
    from swift.utils.registry import SwiftError

    async def broken(self, request, config):
        raise RuntimeError("cannot schedule new futures after shutdown")

    monkeypatch.setattr(ClientEngine, "infer_async", broken)
    with pytest.raises(SwiftError, match="every request failed in the engine"):
        eval_main(["--eval_url", server, "--eval_dataset", "arith", "--eval_limit", "3",
                   "--eval_output_dir", str(tmp_path / "out")])
    assert os.listdir(tmp_path / "out") == []


def test_a_refusal_fails_its_request_and_a_failing_server_is_the_engine_failing(server):
    from swift.pipelines.eval import RequestFailed

    engine = ClientEngine(server)
    try:
        requests = [InferRequest(messages=[{"role": "user", "content": q}]) for q in ("ok", "refuse", "fail")]
        ok, refused, failed = generate(engine, requests, RequestConfig(max_tokens=4), True, desc="client")
    finally:
        engine.close()
    assert ok.choices[0].text == "OK"
    assert "HTTP 400" in str(refused) and not isinstance(refused, RequestFailed)
    assert "HTTP 500" in str(failed) and isinstance(failed, RequestFailed)


def test_eval_against_a_failing_server_stops_and_leaves_nothing(server, tmp_path):
    """Every answer an HTTP 500: no report of zeros, the run stops with the server's error."""
    from swift.pipelines.eval import eval_main
    from swift.utils.registry import SwiftError

    Handler.status = 500
    with pytest.raises(SwiftError, match="every request failed in the engine.*HTTP 500"):
        eval_main(["--eval_url", server, "--eval_dataset", "arith", "--eval_limit", "3",
                   "--eval_output_dir", str(tmp_path / "out")])
    assert os.listdir(tmp_path / "out") == []


def test_eval_against_a_server_that_drops_every_request_stops_and_leaves_nothing(server, tmp_path):
    """The server lists its models, then closes every request's connection unanswered."""
    from swift.pipelines.eval import eval_main
    from swift.utils.registry import SwiftError

    Handler.status = 0
    with pytest.raises(SwiftError, match="every request failed in the engine.*cannot reach the server"):
        eval_main(["--eval_url", server, "--eval_dataset", "arith", "--eval_limit", "3",
                   "--eval_output_dir", str(tmp_path / "out")])
    assert os.listdir(tmp_path / "out") == []


def test_eval_num_proc_caps_the_requests_a_local_engine_gets_at_once():
    """--eval_num_proc N with a model loaded here: at most N requests in the engine at once (as
    ms-swift's eval sends N at a time to the server it deploys); without it, all of them."""
    import asyncio

    class Counting:
        in_flight = peak = 0

        async def infer_async(self, request, config):
            Counting.in_flight += 1
            Counting.peak = max(Counting.peak, Counting.in_flight)
            await asyncio.sleep(0.02)
            Counting.in_flight -= 1
            return "answer"

    requests = [InferRequest(messages=[{"role": "user", "content": f"q{i}"}]) for i in range(12)]
    for concurrency, peak in ((3, 3), (None, 12)):
        Counting.peak = 0
        assert generate(Counting(), requests, RequestConfig(max_tokens=4), True, desc="local",
                        concurrency=concurrency) == ["answer"] * 12
        assert Counting.peak == peak

"""`swift app` in a real browser (headless Chromium): the quickstart's model answers `12+34=` on
the page, streamed; an unreachable --base_url shows one error line and the page keeps working."""
from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.app.browser import bot_messages, chromium, click, element, gradio_errors, text_of, type_into, wait_for
from tests.app.pages import start_page, stop_page
from tests.deploy.serving import free_port



def screenshot(driver, name: str, tmp_path) -> None:
    """Into $SWIFT_TEST_SCREENSHOTS (how docs/images/*.png are made), else the test's folder."""
    folder = os.environ.get("SWIFT_TEST_SCREENSHOTS") or str(tmp_path)
    os.makedirs(folder, exist_ok=True)
    assert driver.save_screenshot(os.path.join(folder, name))


@pytest.fixture(scope="module")
def browser():
    driver = chromium()
    yield driver
    driver.quit()


def test_the_page_streams_the_quickstart_models_answer(quickstart, browser, tmp_path):
    from swift.infer.factory import build_engine
    from swift.infer.protocol import InferRequest, RequestConfig
    from swift.pipelines.app import AppArguments

    _, out = quickstart
    model = os.path.join(out, "sft")
    engine, _ = build_engine(AppArguments(model=model))  # the reference: the same engine, called directly
    first = [{"role": "user", "content": "12+34="}]

    def answer(messages, max_tokens):
        return engine.infer([InferRequest(messages=messages)], RequestConfig(max_tokens=max_tokens))[0].choices[0].text

    try:
        want = answer(first, 16)
        # the second question: the first whose whole answer differs from its one-token cut, so that
        # regenerating with one token visibly replaces it (which questions those are depends on how
        # the quickstart model trained on this CPU: "07+45=" got the one-token answer "6" on one)
        for question in ("07+45=", "23+19=", "31+52=", "44+38="):
            second = [*first, {"role": "assistant", "content": want}, {"role": "user", "content": question}]
            want2, want2_cut = answer(second, 16), answer(second, 1)
            if want2_cut.strip() and want2_cut.strip() != want2.strip():
                break
    finally:
        engine.close()
    assert want == "46" and want2_cut.strip() != want2.strip()
    url, proc = start_page("app", "--model", model, "--max_new_tokens", "16", "--studio_title", "swift quickstart",
                           log=str(tmp_path / "app.log"))
    try:
        browser.get_log("browser")  # what earlier pages logged is not this page's
        browser.get(url)
        wait_for(lambda: element(browser, "message", "textarea"), what="the message box")
        type_into(browser, "message", "12+34=", enter=True)
        answers = wait_for(lambda: [m for m in bot_messages(browser) if m.strip() == want], timeout=60,
                           what="the answer")
        assert answers == [want]
        # multi-turn: the history goes with the next message; regenerate replaces the last answer
        type_into(browser, "message", question, enter=True)
        wait_for(lambda: len(bot_messages(browser)) == 2 and bot_messages(browser)[1].strip() == want2.strip(),
                 timeout=60, what="the second answer")
        # Regenerate with one new token at most (the page's setting): the last answer is replaced
        click(browser, "settings", "button")
        wait_for(lambda: element(browser, "max_new_tokens", "input"), what="the opened settings")
        type_into(browser, "max_new_tokens", "1")
        click(browser, "regenerate")
        wait_for(lambda: bot_messages(browser) == [want, want2_cut.strip()], timeout=60,
                 what="the regenerated answer")
        screenshot(browser, "app.png", tmp_path)
        click(browser, "clear")
        wait_for(lambda: not bot_messages(browser), what="the cleared conversation")
        assert gradio_errors(browser) == []
    finally:
        stop_page(proc)


def test_an_unreachable_base_url_is_one_line_on_the_page(browser, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    url, proc = start_page("app", "--base_url", dead, "--lang", "zh", log=str(tmp_path / "app.log"))
    try:
        browser.get(url)
        wait_for(lambda: element(browser, "message", "textarea"), what="the message box")
        # the page renders in parts: the button may come a moment after the message box
        assert wait_for(lambda: text_of(browser, "send"), what="the send button") == "发送"  # --lang zh
        for attempt in range(2):  # the page keeps working after an error
            type_into(browser, "message", "hello", enter=True)
            line = wait_for(lambda: text_of(browser, "error"), timeout=30, what="the error line")
            assert "cannot reach the server" in line and dead.rsplit("/", 1)[0] in line, line
            assert "\n" not in line.strip()
            assert bot_messages(browser) == []
            click(browser, "clear")
            wait_for(lambda: not text_of(browser, "error"), what="the cleared error")
            time.sleep(0.5)  # Clear also cancels the page's events: let that reach the page first
        assert proc.poll() is None
    finally:
        stop_page(proc)


class _SlowServer(BaseHTTPRequestHandler):
    """An OpenAI-compatible stand-in whose streamed answer says how many messages it was sent; its
    last piece waits until the test sets `release` (so the answer is still streaming whatever the
    machine's load: a fixed two seconds was once too short on a loaded CI machine)."""

    release = threading.Event()

    def do_GET(self):
        self._send(200, "application/json", json.dumps({"data": [{"id": "slow"}]}).encode())

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in ("seen ", str(len(body["messages"])), " messages", "."):
            if piece == ".":
                self.release.wait(timeout=120)
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.2)
        self.wfile.write(b"data: [DONE]\n\n")

    def _send(self, code, kind, data):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_a_question_typed_while_the_answer_streams_is_kept_and_sent_after_it(browser, tmp_path):
    _SlowServer.release.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url, proc = start_page("app", "--base_url", f"http://127.0.0.1:{server.server_port}/v1",
                           log=str(tmp_path / "app.log"))
    try:
        browser.get(url)
        wait_for(lambda: element(browser, "message", "textarea"), what="the message box")
        type_into(browser, "message", "first", enter=True)
        wait_for(lambda: bot_messages(browser) and bot_messages(browser)[0].startswith("seen"), timeout=30,
                 what="the first answer's start")
        type_into(browser, "message", "second", enter=True)  # the first answer is still streaming
        _SlowServer.release.set()  # (until now the first answer's last piece waited)
        # the next answer saw the whole first exchange: user, assistant, user
        wait_for(lambda: bot_messages(browser) == ["seen 1 messages.", "seen 3 messages."], timeout=30,
                 what="both answers")
        assert element(browser, "message", "textarea").get_attribute("value") == ""
        assert gradio_errors(browser) == []
    finally:
        _SlowServer.release.set()
        browser.get("about:blank")  # leave the page before it stops: its closed stream is no later test's error
        stop_page(proc)
        server.shutdown()

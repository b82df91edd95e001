"""The chat page's overhead: `swift app` in headless Chromium against the same request streamed
straight from `swift deploy`.

Both serve the same model in their own process with the same engine (`--infer_backend transformers`,
greedy, the same max_new_tokens); both are warmed up with `--warmup` requests first. For the page,
the clock starts when Enter is pressed in the message box and a MutationObserver on the chat
records when the answer's first text appears and when it last changes (the page is done when its
Stop-able event ends). For deploy, the `openai` client streams `/v1/chat/completions`: time to the
first content chunk and to the end of the stream. Medians over `--repeats` questions (different
sums, the same on both sides).

    python benchmarks/app_latency.py --model <quickstart dir>/sft
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.app.browser import bot_messages, chromium, click, element, wait_for  # noqa: E402
from tests.deploy.serving import free_port  # noqa: E402

WATCH = """
const chat = document.querySelector('#chatbot');
window.__marks = {first: null, last: null, start: null};
const bots = () => Array.from(chat.querySelectorAll("[data-testid='bot']")).map(e => e.innerText).join('|');
window.__before = bots();
if (window.__obs) window.__obs.disconnect();
window.__obs = new MutationObserver(() => {
  const now = performance.now();
  const text = bots();
  if (text !== window.__before && text.trim() !== window.__before.trim()) {
    if (window.__marks.first === null) window.__marks.first = now;
    window.__marks.last = now;
    window.__before = text;
  }
});
window.__obs.observe(chat, {subtree: true, childList: true, characterData: true});
"""


def start(argv: list[str], url: str, timeout: float = 300) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "swift", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"swift {argv[0]} did not come up")


def page_once(driver, question: str) -> tuple[float, float]:
    """One question in a fresh conversation (as deploy gets it: no history)."""
    click(driver, "clear")
    wait_for(lambda: not bot_messages(driver), what="the cleared conversation")
    time.sleep(0.5)  # the clear's cancellation reaches the server before the next question does
    driver.execute_script(WATCH)
    box = element(driver, "message", "textarea")
    box.clear()
    box.send_keys(question)
    start = driver.execute_script("return performance.now();")
    box.send_keys("\n")
    # done: the answer stopped changing for a while (the stream has ended)
    wait_for(lambda: driver.execute_script("return window.__marks.last") is not None, timeout=60,
             what="the answer on the page")
    while True:
        last = driver.execute_script("return window.__marks.last")
        time.sleep(0.5)
        if driver.execute_script("return window.__marks.last") == last:
            break
    marks = driver.execute_script("return window.__marks")
    return (marks["first"] - start) / 1000, (marks["last"] - start) / 1000


def deploy_once(client, model: str, question: str, max_tokens: int) -> tuple[float, float]:
    start = time.perf_counter()
    first = None
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                            max_tokens=max_tokens, temperature=0, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first is None:
            first = time.perf_counter() - start
    return first, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max_new_tokens", type=int, default=16)
    a = parser.parse_args()
    questions = [f"{i:02d}+{(7 * i + 13) % 100:02d}=" for i in range(a.warmup + a.repeats)]
    common = ["--model", a.model, "--infer_backend", "transformers", "--max_new_tokens", str(a.max_new_tokens)]
    app_port, deploy_port = free_port(), free_port()
    app_argv = ["app", *common, "--server_port", str(app_port), "--temperature", "0"]
    deploy_argv = ["deploy", "--model", a.model, "--infer_backend", "transformers", "--port", str(deploy_port)]
    print(json.dumps({"app": app_argv, "deploy": deploy_argv + ["(per request: max_tokens", a.max_new_tokens,
                                                                "temperature 0, stream true)"],
                      "repeats": a.repeats, "warmup": a.warmup, "machine": platform.processor() or platform.machine(),
                      "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}, indent=1))
    from openai import OpenAI

    deploy = start(deploy_argv, f"http://127.0.0.1:{deploy_port}/health")
    app = start(app_argv, f"http://127.0.0.1:{app_port}/")
    driver = chromium()
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{deploy_port}/v1", api_key="-")
        model = client.models.list().data[0].id
        driver.get(f"http://127.0.0.1:{app_port}/")
        wait_for(lambda: element(driver, "message", "textarea"), what="the page")
        page, direct = [], []
        for i, q in enumerate(questions):  # alternate, so drift affects both alike
            p = page_once(driver, q)
            d = deploy_once(client, model, q, a.max_new_tokens)
            if i >= a.warmup:
                page.append(p)
                direct.append(d)
        med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
        rows = {"page first token s": med(page, 0), "page last token s": med(page, 1),
                "deploy first token s": med(direct, 0), "deploy last token s": med(direct, 1)}
        rows["first token ratio (page / deploy)"] = rows["page first token s"] / rows["deploy first token s"]
        rows["last token ratio (page / deploy)"] = rows["page last token s"] / rows["deploy last token s"]
        for k, v in rows.items():
            print(f"{k:36s} {v:.3f}")
    finally:
        driver.quit()
        for proc in (app, deploy):
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()

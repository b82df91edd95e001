"""`swift web-ui` in a real browser (headless Chromium): the page asks for --auth; every tab (each command's
form among them) renders without gradio errors; an sft
run launched from the form trains 30 steps while the page shows its progress and draws its loss; a
second run is stopped; a restarted console lists both from their directories; the finished run's
model answers in the Chat tab."""
from __future__ import annotations

import json

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from swift.app import runs as R
from swift.app.console import launchable
from tests.app.browser import (bot_messages, chromium, click, element, gradio_errors, log_in, text_of, type_into,
                               wait_for)
from tests.app.pages import start_page, stop_page
from tests.app.test_app import screenshot


def reference_answer(model: str, question: str, max_tokens: int) -> str:
    from swift.infer.factory import build_engine
    from swift.infer.protocol import InferRequest, RequestConfig
    from swift.pipelines.app import AppArguments

    engine, _ = build_engine(AppArguments(model=model))
    try:
        return engine.infer([InferRequest(messages=[{"role": "user", "content": question}])],
                            RequestConfig(max_tokens=max_tokens))[0].choices[0].text
    finally:
        engine.close()


@pytest.fixture(scope="module")
def browser():
    driver = chromium()
    yield driver
    driver.quit()


def open_tab(driver, name: str) -> None:
    """Click the tab button whose text is `name`."""
    buttons = [b for b in driver.find_elements(By.CSS_SELECTOR, "button[role='tab']") if b.text.strip() == name]
    assert buttons, f"no tab {name!r}"
    driver.execute_script("arguments[0].click();", buttons[0])


def runs_table(driver) -> dict[str, list[str]]:
    """run id -> its row's cells, as the Runs tab shows them."""
    rows = {}
    for row in driver.find_elements(By.CSS_SELECTOR, "#runs_table [role='row'].virtual-row"):
        cells = [cell.text.strip() for cell in row.find_elements(By.CSS_SELECTOR, "[role='gridcell']")]
        if cells and cells[0]:
            rows[cells[0]] = cells
    return rows


def choose(driver, elem_id: str, value: str) -> None:
    """Pick `value` in a gr.Dropdown."""
    box = element(driver, elem_id, "input")
    box.click()
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(value)
    box.send_keys(Keys.ENTER)


def select_run(driver, run_id: str) -> None:
    """Pick the run (again, if the page's refresh redrew the dropdown while it was being typed in)."""
    for attempt in range(4):
        choose(driver, "run_select", run_id)
        try:
            wait_for(lambda: run_id in text_of(driver, "run_status"), timeout=15, what=f"{run_id} selected")
            return
        except AssertionError:
            if attempt == 3:
                raise


# full fine-tuning at a high rate: within 30 steps of 64 rows the tiny model answers with a digit
# (after 10 it still ends at once), and the steps take long enough for the page to see them pass
EXTRA = "--save_strategy no --report_to none --learning_rate 3e-3"


def fill_sft(driver, max_steps: int) -> None:
    open_tab(driver, "Launch")
    open_tab(driver, "swift sft")
    type_into(driver, "sft-model", "builtin:tiny-chat")
    type_into(driver, "sft-dataset", "builtin:arith-sft#2048")
    choose(driver, "sft-tuner_type", "full")
    type_into(driver, "sft-max_steps", str(max_steps))
    type_into(driver, "sft-logging_steps", "1")
    type_into(driver, "sft-per_device_train_batch_size", "64")
    type_into(driver, "sft-extra", EXTRA)


def launch(driver, previous: str | None = None) -> str:
    """Launch the filled form; the new run's id. An earlier launch's message (naming `previous`) may
    still be on the page, and read as empty while its tab is being shown: wait for one naming another run."""
    before = text_of(driver, "sft-message")
    click(driver, "sft-launch")
    message = wait_for(lambda: "sft-" in text_of(driver, "sft-message") and text_of(driver, "sft-message") != before
                       and (previous is None or previous not in text_of(driver, "sft-message"))
                       and text_of(driver, "sft-message"), what="the launched run")
    return message.split("`")[-2] if "`" in message else message.split()[-1]


AUTH = ("ada", "s3cret")


def test_console_launches_watches_stops_and_chats(browser, tmp_path):
    runs_dir = tmp_path / "runs"
    log = str(tmp_path / "console.log")
    url, proc = start_page("web-ui", "--runs_dir", str(runs_dir), "--auth", ":".join(AUTH), log=log)
    try:
        log_in(browser, url, *AUTH)
        wait_for(lambda: element(browser, "pt-model", "textarea, input"), what="the first form")
        # every tab (before 2026-12-07 the test left out the forms of export, attack and estimate)
        for tab in [*(f"swift {c}" for c in launchable()), "Runs", "Chat", "Launch"]:
            open_tab(browser, tab)
        assert gradio_errors(browser) == []

        # a misspelt flag: one line from our parser, nothing launched
        fill_sft(browser, 30)
        type_into(browser, "sft-extra", "--lerning_rate 1e-3")
        click(browser, "sft-check")
        line = wait_for(lambda: text_of(browser, "sft-message"), what="the error line")
        assert "unknown flag '--lerning_rate'" in line and "--learning_rate" in line, line
        type_into(browser, "sft-extra", "--max_stepz 3")
        click(browser, "sft-launch")
        line = wait_for(lambda: "max_stepz" in text_of(browser, "sft-message") and text_of(browser, "sft-message"),
                        what="the refused launch")
        assert "unknown flag '--max_stepz'" in line, line
        assert not runs_dir.exists() or not any(runs_dir.iterdir())  # nothing started, no directory left

        # the exact command, then the run
        type_into(browser, "sft-extra", EXTRA)
        click(browser, "sft-check")
        command = wait_for(lambda: element(browser, "sft-command", "textarea").get_attribute("value"),
                           what="the command")
        assert command.startswith("swift sft --model builtin:tiny-chat --dataset 'builtin:arith-sft#2048'") \
            and "--max_steps 30" in command and "--tuner_type full" in command and "--add_version false" in command, command
        finished = launch(browser)
        open_tab(browser, "Runs")
        select_run(browser, finished)
        seen = set()

        def progress():
            status = text_of(browser, "run_status")
            if "running" in status and "step " in status:
                seen.add(status.split("step ")[1].split()[0])
            return "finished" in status and status

        wait_for(progress, timeout=600, every=0.2, what="the run to finish")
        assert len(seen) >= 2, seen  # while it ran, the page showed its progress advance
        wait_for(lambda: element(browser, "run_curves", "img"), what="the loss curve")
        assert "'train_loss'" in element(browser, "run_log", "textarea").get_attribute("value")  # the log's tail
        screenshot(browser, "web-ui.png", tmp_path)

        # a second run, stopped while it trains
        fill_sft(browser, 100000)
        stopped = launch(browser, previous=finished)
        open_tab(browser, "Runs")
        select_run(browser, stopped)
        wait_for(lambda: "step " in text_of(browser, "run_status"), timeout=300, what="the second run training")
        click(browser, "stop_run")
        reply = wait_for(lambda: stopped in text_of(browser, "runs_message") and text_of(browser, "runs_message"),
                         what="the stop's reply")
        assert "not running" not in reply, reply
        # the keeper kills the command 20 s after SIGTERM at the latest; the page polls every second
        # (a generous bound: on a loaded 2-core machine the page's refreshes queue behind the run)
        try:
            wait_for(lambda: "stopped" in text_of(browser, "run_status"), timeout=300, what="the stopped run")
        except AssertionError as e:  # what the page and the run directory say then
            tail = (runs_dir / stopped / "run.log").read_text(errors="replace")[-1500:]
            raise AssertionError(f"{e}; status {text_of(browser, 'run_status')!r}; exit record: "
                                 f"{(runs_dir / stopped / 'swift_exit.json').exists()}; log tail: {tail}") from None
        exit_record = json.loads((runs_dir / stopped / "swift_exit.json").read_text())
        assert exit_record["stopped"] and exit_record["returncode"] != 0

        # a restarted console finds both runs from their directories
        stop_page(proc)
        url, proc = start_page("web-ui", "--runs_dir", str(runs_dir), "--auth", ":".join(AUTH), log=log)
        log_in(browser, url, *AUTH)
        browser.get_log("browser")  # the old page's failed heartbeats to the stopped console: expected
        wait_for(lambda: element(browser, "pt-model", "textarea, input"), what="the restarted console")
        open_tab(browser, "Runs")
        rows = wait_for(lambda: len(runs_table(browser)) == 2 and runs_table(browser), what="both runs listed")
        assert rows[finished][1] == "finished" and rows[finished][2] == "step 30/30 (100%)", rows
        assert rows[stopped][1] == "stopped", rows

        # chat with the finished run's model: the page's answer is the engine's
        want = reference_answer(str(runs_dir / finished), "12+34=", max_tokens=2)
        assert want.strip()
        select_run(browser, finished)
        click(browser, "chat_run")
        open_tab(browser, "Chat")
        wait_for(lambda: finished in text_of(browser, "chat_model"), timeout=180, what="the run's model loaded")
        click(browser, "chat_settings", "button")  # open the generation settings
        wait_for(lambda: element(browser, "chat_max_new_tokens", "input"), what="the opened settings")
        type_into(browser, "chat_max_new_tokens", "2")
        type_into(browser, "chat_message", "12+34=", enter=True)
        wait_for(lambda: bot_messages(browser, "chat_chatbot") == [want.strip()], timeout=120,
                 what=f"the run's model answering {want!r}")
        assert text_of(browser, "chat_error") == ""
        assert gradio_errors(browser) == []
    finally:
        stop_page(proc)
        for run in R.list_runs(str(runs_dir)):  # a failed test leaves no run training
            if run.status == "running":
                R.stop(run)
    assert "Traceback" not in open(log, errors="replace").read()  # no handler of either console failed

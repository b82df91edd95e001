"""Headless Chromium driven by Selenium, and helpers for gradio pages (elements found by elem_id)."""
from __future__ import annotations

import shutil
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys


def chromium() -> webdriver.Chrome:
    """Debian's chromium and chromium-driver (installed by .ci/run), headless, with the browser's
    console log kept (`driver.get_log("browser")`)."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not binary or not driver:
        raise RuntimeError("the browser tests need Debian's chromium and chromium-driver "
                           "(README: apt-get install -y chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    browser.set_page_load_timeout(60)
    return browser


def log_in(driver, url: str, user: str, password: str) -> None:
    """Log in to a gradio page that has --auth (its /login, posted from the page's origin so the
    browser keeps the cookie), then open the page."""
    driver.get(url)
    status = driver.execute_async_script(
        "const [url, user, password, done] = arguments;"
        "fetch(url + 'login', {method: 'POST', credentials: 'same-origin',"
        " body: new URLSearchParams({username: user, password: password})})"
        ".then(r => done(r.status), e => done(String(e)));", url, user, password)
    assert status == 200, f"login refused: {status}"
    driver.get(url)


def wait_for(condition, timeout: float = 60.0, every: float = 0.1, what: str = "the page"):
    """The first truthy value of `condition()` within `timeout` seconds."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            value = condition()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - the element may not be there yet
            last = e
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f" (last error: {last!r})" if last else ""))


def element(driver, elem_id: str, css: str = ""):
    """The element of that elem_id, or the first of its descendants matching `css` (alternatives by
    commas, each within the element)."""
    selector = ", ".join(f"#{elem_id} {part.strip()}".strip() for part in css.split(",")) if css else f"#{elem_id}"
    return driver.find_element(By.CSS_SELECTOR, selector)


def type_into(driver, elem_id: str, text: str, enter: bool = False) -> None:
    box = element(driver, elem_id, "textarea, input")
    box.clear()
    box.send_keys(text)
    if enter:
        box.send_keys(Keys.ENTER)


def click(driver, elem_id: str, css: str = "") -> None:
    el = element(driver, elem_id, css)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
    el.click()


def text_of(driver, elem_id: str, css: str = "") -> str:
    return element(driver, elem_id, css).text


def bot_messages(driver, elem_id: str = "chatbot") -> list[str]:
    """The texts of the assistant's messages shown in a gr.Chatbot."""
    return [m.text for m in driver.find_elements(By.CSS_SELECTOR, f"#{elem_id} [data-testid='bot']")]


def gradio_errors(driver) -> list[str]:
    """The browser console's errors, and gradio's error toasts on the page."""
    logs = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    toasts = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "[data-testid='toast-body']")]
    return logs + toasts

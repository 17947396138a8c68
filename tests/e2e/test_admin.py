"""The /admin page in a real headless Chromium (Debian's `chromium` and
`chromium-driver`, from scripts/system-deps.sh, driven by selenium): behind
an API key, against a real `hangar serve` with mlx-lm on a generated tiny
model, the page loads without console errors, loads and pins a model,
follows its log and the events live, shows a refused change with the
server's message, and streams a chat; against the mlxcel stand-in at a
version without the reasoning budget, it shows that setting as unavailable
with its reason and a change to it refused with the 422's reason.

A missing browser or driver fails this test: it never skips.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from conftest import Server, http
from test_mlxcel import Host

KEY = "admin-secret"
MODEL = "tiny-llama"
WAIT_S = 60


@pytest.fixture
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        pytest.fail(f"selenium is not installed ({e}); run scripts/python-env.sh", pytrace=False)
    chromium = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail(
            f"chromium ({chromium}) or chromedriver ({driver}) is missing; run scripts/system-deps.sh",
            pytrace=False,
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    b = webdriver.Chrome(service=Service(driver), options=options)
    b.implicitly_wait(0)
    yield b
    b.quit()


def wait(what: str, predicate, timeout: float = WAIT_S):
    """Polls `predicate` (exceptions count as not yet) until it is truthy."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # the page is still rendering: try again
            last = e
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout} s waiting for {what} (last error: {last!r})", pytrace=False)


def by_id(b, id_: str):
    return b.find_element("id", id_)


def css(b, selector: str):
    return b.find_element("css selector", selector)


def click(b, selector: str):
    """Clicks `selector`, again if the tables re-rendered under it."""
    def attempt():
        css(b, selector).click()
        return True
    wait(f"a click on {selector}", attempt)


def text(b, selector: str) -> str:
    return wait(f"the text of {selector}", lambda: css(b, selector).text)


def console_errors(b) -> list[str]:
    """The browser's SEVERE console entries since the last call."""
    return [e["message"] for e in b.get_log("browser") if e["level"] == "SEVERE"]


def only_the_refusal(b):
    """The console since the last look holds the refused PUT (which shows
    the console is read at all) and nothing else."""
    errors = console_errors(b)
    refusals = [m for m in errors if "status of 422" in m]
    assert refusals, f"the 422 is not in the browser's console: {errors}"
    assert [m for m in errors if m not in refusals] == [], errors


def own_server(env, tmp: Path, extra: list[str]) -> Server:
    """A `hangar serve` over the suite's models with its own config,
    settings and state (pins and settings stay here)."""
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "config.toml"
    shutil.copy(env["config"], config)
    shutil.copy(env["root"] / "settings.toml", tmp / "settings.toml")
    args = list(env["base_args"])
    args[args.index("--config") + 1] = str(config)
    args[args.index("--state-dir") + 1] = str(tmp / "state")
    return Server("hangar (admin)", args + extra, env["proc_env"])


def test_admin_page_drives_a_real_engine(env, tmp_path, browser):
    b = browser
    srv = own_server(env, tmp_path / "host", ["--api-key", KEY])
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        # Without the key, the page says so and makes no refused calls.
        b.get(srv.url + "/admin")
        wait("the key prompt", lambda: "needs its API key" in by_id(b, "status").text)
        assert console_errors(b) == []

        # The key, kept in session storage, opens the page.
        by_id(b, "api-key").send_keys(KEY)
        css(b, "#key-form button[type=submit]").click()
        assert b.execute_script("return sessionStorage.getItem('hangar-api-key')") == KEY
        row = text(b, "#engines-body tr[data-plugin='mlx-lm']")
        assert "ready" in row and "mlx" in row, row
        wait("the model row", lambda: css(b, f"#models-body tr[data-model='{MODEL}']"))
        # A reload keeps the key (session storage) and still logs nothing bad.
        b.refresh()
        wait("the model row after a reload", lambda: css(b, f"#models-body tr[data-model='{MODEL}']"))
        assert console_errors(b) == []

        # Load: the row turns ready, the events stream shows it live.
        click(b, f"#models-body tr[data-model='{MODEL}'] button.load")
        wait("the model to be ready", lambda: css(
            b, f"#models-body tr[data-model='{MODEL}'] td.state").text == "ready", timeout=120)
        wait("the loaded event", lambda: css(b, "#events li[data-kind='loaded']"))
        row = text(b, f"#models-body tr[data-model='{MODEL}']")
        assert "mlx-lm" in row and "MiB" in row, row

        # Pin, through the model's settings.
        click(b, f"#models-body tr[data-model='{MODEL}'] input.pin")
        wait("the pin to be stored", lambda: http(
            f"{srv.url}/api/models/{MODEL}/settings", headers=auth)[1]["stored"].get("pin") is True)
        wait("when the pin applies", lambda: "applies on the model's next load" in text(b, "#status"))
        wait("the pin box to stay checked", lambda: css(
            b, f"#models-body tr[data-model='{MODEL}'] input.pin").is_selected())
        # Stored settings apply from the next load: unload, load, pinned.
        click(b, f"#models-body tr[data-model='{MODEL}'] button.unload")
        wait("the unloaded event", lambda: css(b, "#events li[data-kind='unloaded']"))
        wait("the model to be unloaded", lambda: text(
            b, f"#models-body tr[data-model='{MODEL}'] td.state") == "available")
        click(b, f"#models-body tr[data-model='{MODEL}'] button.load")
        wait("the model to be ready again", lambda: css(
            b, f"#models-body tr[data-model='{MODEL}'] td.state").text == "ready", timeout=120)
        scheduler = http(srv.url + "/api/sessions", headers=auth)[1]["scheduler"]
        assert [m["pin"] for m in scheduler["models"] if m["model"] == MODEL] == [True], scheduler

        # The session's log, live.
        click(b, "#sessions-body tr button.logs")
        wait("log lines", lambda: len(by_id(b, "logs").text.splitlines()) >= 2)

        # A settings form from the schema; a refused change shows the
        # server's message.
        by_id(b, "settings-model").send_keys(MODEL)

        def submit_kv_bits():
            field = css(b, f"#settings-form[data-model='{MODEL}'] #setting-kv_bits")
            field.clear()
            field.send_keys("3")
            css(b, "#settings-form button[type=submit]").click()
            return True
        wait("the kv_bits field", submit_kv_bits)
        result = wait("the refusal", lambda: by_id(b, "settings-result").text)
        assert result == "422: setting 'kv_bits' must be between 4 and 8, not 3", result

        # A chat streams, in several chunks, through the key.
        by_id(b, "chat-model").send_keys(MODEL)
        by_id(b, "chat-input").send_keys("hello there")
        by_id(b, "chat-send").click()
        answer = wait("the answer", lambda: css(b, "#chat-log .assistant[data-done='true']"), timeout=120)
        assert int(answer.get_attribute("data-chunks")) >= 2, answer.get_attribute("outerHTML")
        assert answer.text.strip(), "the answer is empty"

        # Nothing went wrong in the page but the refusal it was sent.
        only_the_refusal(b)
    finally:
        # The page still holds its event and log streams open: they must
        # not keep the host from stopping.
        problems = srv.stop()
    assert problems == [], problems
    assert srv.stop_seconds is not None and srv.stop_seconds < 10, srv.stop_seconds


def test_admin_page_shows_a_gated_setting_and_its_refusal(env, tmp_path, browser):
    b = browser
    host = Host(env, tmp_path / "mlxcel", "0.0.20")
    try:
        b.get(host.url + "/admin")
        by_id(b, "settings-model").send_keys(MODEL)
        gated = text(b, "#settings-unavailable li[data-setting='reasoning_budget']")
        assert "needs mlxcel-server >=0.0.25 for reasoning_budget; found 0.0.20" in gated, gated

        css(b, "#settings-raw summary").click()
        box = by_id(b, "settings-json")
        box.clear()
        box.send_keys(json.dumps({"reasoning_budget": 0}))
        by_id(b, "settings-json-save").click()
        result = wait("the refusal", lambda: by_id(b, "settings-result").text)
        assert result.startswith("422: "), result
        assert "setting 'reasoning_budget' is unavailable: plugin 'mlxcel' needs mlxcel-server >=0.0.25" in result, result
        only_the_refusal(b)
    finally:
        host.close()

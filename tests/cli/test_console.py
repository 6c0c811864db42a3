"""The browser console (`aiptrain serve` at /): Debian's Chromium driven by Selenium against a
real server on a free loopback port, with real jobs on the minimal runtime. The tests save the
screenshots that docs/guide/console.md shows (docs/images/console-*.png)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest

from aiptrain.api.access import load_tokens
from aiptrain.api.app import App
from aiptrain.api.calls import Request
from aiptrain.api.server import make_server
from aiptrain.client import Client
from aiptrain.model import Job, TrainingInput
from aiptrain.settings import Settings
from aiptrain.states import State
from aiptrain.vertex.records import CUSTOM_JOBS, VertexRecords

import test_rest_api
from conftest import IN_CI, wait_for
from test_rest_api import PROJECT, WRITER_A, raw, seed, write_log

# The REST API tests' fixtures: an isolated home, a server on a free port, a tokens file, a package.
api_home, serve, tokens_file = test_rest_api.api_home, test_rest_api.serve, test_rest_api.tokens_file

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
WAIT = 60  # seconds a page may take to show what it should: generous, never a timing assertion


# -- the files (no browser) -----------------------------------------------------------------------

@pytest.mark.parametrize("path, code, kind", [
    ("/", 200, "text/html"),
    ("/console/console.js", 200, "text/javascript"),
    ("/console/chart.js", 200, "text/javascript"),
    ("/console/console.css", 200, "text/css"),
    ("/console/missing.js", 404, "application/json"),
    ("/console/../app.py", 404, "application/json"),
    ("/console/%2e%2e%2fapp.py", 404, "application/json"),
    ("/console/", 404, "application/json"),
    ("/console/.hidden.js", 404, "application/json"),
    ("/console/__init__.py", 404, "application/json"),
])
def test_the_console_files_are_served_and_nothing_else(api_home, path, code, kind):
    response = App(Settings()).handle(Request("GET", path))
    assert response.code == code and response.content_type.startswith(kind)
    if code == 200:
        assert "script-src 'self'" in response.headers["Content-Security-Policy"]
        assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_the_page_names_the_default_project_and_needs_no_token_but_the_api_does(api_home, tokens_file):
    app = App(Settings(), load_tokens(tokens_file))
    page = app.handle(Request("GET", "/"))
    assert page.code == 200 and f'content="{PROJECT}"' in page.data.decode()
    assert app.handle(Request("GET", f"/v1/projects/{PROJECT}/jobs")).code == 401
    assert app.handle(Request("POST", "/", body=b"{}")).data is None  # only GET (and HEAD) serve the console
    assert app.handle(Request("HEAD", "/console/console.css")).code == 200


def test_the_cli_does_not_import_the_console():
    code = "import sys, aiptrain.cli; print('aiptrain.console' in sys.modules, 'aiptrain.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# -- in the browser --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chromium():
    """Headless Chromium under chromedriver (Debian's chromium and chromium-driver)."""
    if not (shutil.which(CHROMIUM) and shutil.which(DRIVER)):
        reason = f"no {CHROMIUM} and {DRIVER}: run scripts/install-chromium.sh (Debian's chromium and chromium-driver)"
        if IN_CI:
            pytest.fail(f"{reason} (CI=true: browser tests must not skip)")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000",
                     "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def browser(chromium):
    """The browser, at laptop size with a clean localStorage; its console errors fail the test."""
    chromium.set_window_size(1280, 1000)
    yield chromium
    # Script errors only: a refused or dropped request (401, the network changing as Docker adds
    # a job's network) is the console's to show, not a fault.
    errors = [entry for entry in chromium.get_log("browser")
              if entry["level"] == "SEVERE" and entry.get("source") != "network"]
    try:
        chromium.execute_script("localStorage.clear()")
    except Exception:  # noqa: BLE001 - a page that never loaded has no storage to clear
        pass
    assert not errors, errors


def find(driver, css: str, text: str | None = None, timeout: float = WAIT):
    """The first element matching `css` (and holding `text`), once the page shows it."""
    from selenium.webdriver.common.by import By

    def found():
        for element in driver.find_elements(By.CSS_SELECTOR, css):
            try:
                if element.is_displayed() and (text is None or text in element.text):
                    return element
            except Exception:  # noqa: BLE001 - re-rendered meanwhile: look again
                continue
        return None

    try:
        return wait_for(found, timeout=timeout, interval=0.2, what=f"{css} {text or ''} in the page")
    except AssertionError:
        driver.save_screenshot("/tmp/console-failure.png")
        print(driver.get_log("browser"))
        raise


def rows(driver) -> dict[str, str]:
    """The jobs table: job ID -> its state's text."""
    from selenium.webdriver.common.by import By

    try:
        return {row.get_attribute("data-job"): row.find_element(By.CSS_SELECTOR, ".state").get_attribute("data-state")
                for row in driver.find_elements(By.CSS_SELECTOR, "#jobs-body tr")}
    except Exception:  # noqa: BLE001 - the table was re-rendered while read
        return {}


def test_a_token_server_refuses_the_api_without_a_token_and_the_console_asks_for_one(serve, browser, tokens_file):
    seed("token_job", labels={"team": "a"})
    url = serve(load_tokens(tokens_file))
    code, error = raw(url, "GET", f"/v1/projects/{PROJECT}/jobs")
    assert code == 401 and error["error"]["status"] == "UNAUTHENTICATED"

    browser.get(url + "/")
    find(browser, "#token-dialog", "needs a token")
    assert rows(browser) == {}
    browser.find_element("css selector", '#token-dialog button[value="cancel"]').click()
    find(browser, "#jobs-error", "missing required authentication credential")
    browser.find_element("id", "token-button").click()
    find(browser, "#token-dialog", "needs a token")
    browser.find_element("id", "token-input").send_keys(WRITER_A)
    browser.find_element("id", "token-save").click()
    wait_for(lambda: rows(browser) == {"token_job": "SUCCEEDED"}, timeout=WAIT, what="the job after the token")


def test_the_jobs_table_pages_and_sorts(serve, browser):
    for n in range(12):
        seed(f"paged_{n:02d}", minutes_ago=n)  # paged_00 is the newest
    browser.get(serve() + "/")
    from selenium.webdriver.support.ui import Select

    wait_for(lambda: len(rows(browser)) == 12, timeout=WAIT, what="the first page of 20")
    Select(browser.find_element("id", "page-size")).select_by_visible_text("10")
    wait_for(lambda: list(rows(browser)) == [f"paged_{n:02d}" for n in range(10)], timeout=WAIT, what="10 rows")
    browser.find_element("id", "next-page").click()
    wait_for(lambda: list(rows(browser)) == ["paged_10", "paged_11"], timeout=WAIT, what="the older page")
    browser.find_element("id", "prev-page").click()
    wait_for(lambda: len(rows(browser)) == 10, timeout=WAIT, what="the newer page again")
    browser.find_element("css selector", 'th[data-sort="createTime"]').click()  # newest first, then oldest
    browser.find_element("css selector", 'th[data-sort="createTime"]').click()
    wait_for(lambda: list(rows(browser))[:2] == ["paged_09", "paged_08"], timeout=WAIT, what="oldest first")


def test_a_long_log_is_paged_and_the_severity_filter_applies(serve, browser):
    seed("long_log")
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    stamp = lambda n: (start + timedelta(seconds=n)).isoformat().replace("+00:00", "Z")  # noqa: E731
    write_log("long_log", [(stamp(n), "master-replica-0", "INFO", f"line {n}") for n in range(1200)]
              + [(stamp(1200), "worker-replica-0", "ERROR", "the last one")])
    url = serve()
    browser.get(f"{url}/#/jobs/long_log")
    wait_for(lambda: messages(browser)[-1:] == ["the last one"], timeout=WAIT, what="the newest line")
    assert len(messages(browser)) == 500  # the newest page only
    find(browser, "#log-earlier").click()
    wait_for(lambda: len(messages(browser)) == 1000, timeout=WAIT, what="an earlier page")
    assert messages(browser)[0] == "line 201"
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", "log-severity")).select_by_value("ERROR")
    wait_for(lambda: messages(browser) == ["the last one"], timeout=WAIT, what="the severity filter")
    Select(browser.find_element("id", "log-severity")).select_by_value("")
    Select(browser.find_element("id", "log-task")).select_by_value("master-replica-0")
    wait_for(lambda: messages(browser)[-1:] == ["line 1199"], timeout=WAIT, what="the task filter")
    assert "the last one" not in messages(browser)


def test_a_log_growing_fast_keeps_at_most_5000_rows(serve, browser):
    seed("busy_log")
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    stamp = lambda n: (start + timedelta(milliseconds=n)).isoformat().replace("+00:00", "Z")  # noqa: E731
    write_log("busy_log", [(stamp(0), "master-replica-0", "INFO", "line 0")])
    browser.get(f"{serve()}/#/jobs/busy_log")
    wait_for(lambda: messages(browser) == ["line 0"], timeout=WAIT, what="the first line")
    write_log("busy_log", [(stamp(n), "master-replica-0", "INFO", f"line {n}") for n in range(1, 6001)])
    wait_for(lambda: messages(browser)[-1:] == ["line 6000"], timeout=WAIT * 2, what="the last line")
    shown = messages(browser)
    assert len(shown) == 5000 and shown[0] == "line 1001"
    find(browser, "#log-earlier").click()
    wait_for(lambda: messages(browser)[:1] == ["line 501"], timeout=WAIT, what="the 500 lines before")


def seed_vertex(numeric_id: str, display_name: str, location: str = "us-central1") -> str:
    """A Vertex AI custom job that ended: its ml v1 job and its record, as a create leaves them."""
    job_id = f"custom_job_{numeric_id}"
    seed(job_id)
    with Client(settings=Settings()) as client:
        body = {"displayName": display_name, "jobSpec": {"workerPoolSpecs": [
            {"replicaCount": "1", "containerSpec": {"imageUri": "aiptrain/runtime:minimal"}}]}}
        VertexRecords(client.store).add(PROJECT, CUSTOM_JOBS, location, body, job_key=client.key(job_id),
                                        numeric_id=numeric_id)
    return job_id


def test_vertex_jobs_read_as_vertex_jobs_beside_ai_platform_jobs(serve, browser):
    seed("plain_job", minutes_ago=2)
    seed("custom_job_42", minutes_ago=1)  # named like one, but no Vertex AI job behind it
    vertex_job = seed_vertex("1234567890123456789", "census training")
    browser.get(serve() + "/")
    marker = find(browser, f'tr[data-job="{vertex_job}"] .vertex', "Vertex AI")
    assert marker.get_attribute("title") == "projects/team-a/locations/us-central1/customJobs/1234567890123456789"
    link = browser.find_element("css selector", f'tr[data-job="{vertex_job}"] td.id a')
    assert (link.text, link.get_attribute("title")) == ("census training", vertex_job)
    wait_for(lambda: set(rows(browser)) == {"plain_job", "custom_job_42", vertex_job}, timeout=WAIT, what="the rows")
    assert browser.find_elements("css selector", ".vertex") == [marker]  # the ml v1 jobs read as they are
    assert browser.find_element("css selector", 'tr[data-job="custom_job_42"] td.id a').text == "custom_job_42"

    link.click()
    find(browser, "#job-title", "census training")
    find(browser, "#job-kind .vertex", "Vertex AI")
    details = find(browser, "#job-details", "projects/team-a/locations/us-central1/customJobs/1234567890123456789")
    assert f"Runs as ml v1 job\n{vertex_job}" in details.text
    browser.get(f"{serve()}/#/jobs/plain_job")
    find(browser, "#job-title", "plain_job")
    assert not browser.find_elements("css selector", "#job-kind .vertex")
    assert "Vertex AI resource" not in find(browser, "#job-details", "Created").text


def messages(driver) -> list[str]:
    """The log's messages, read in the page in one call (thousands of elements one by one take minutes)."""
    return driver.execute_script('return [...document.querySelectorAll("#log .line .msg")].map(m => m.textContent)')


# -- TensorBoard (the optional extra; in the test extra) ---------------------------------------------

@pytest.fixture
def app_server(api_home):
    """(url, app) of a server on a free loopback port; the app closed (its TensorBoards stopped) after."""
    app = App(Settings())
    server = make_server(app, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", app
    server.shutdown()
    server.server_close()
    thread.join()
    app.close()


def test_the_tensorboard_button_starts_tensorboard_on_the_job_dir(app_server, browser, tmp_path):
    url, app = app_server
    job_dir = tmp_path / "out"
    job_dir.mkdir()
    with Client() as client:
        client.store.create(Job(job_id="with_board", training_input=TrainingInput(job_dir=str(job_dir))))
        # Ended: a queued job would have the server's controller drive it, and fail it with no engine here.
        client.store.transition(client.key("with_board"), State.SUCCEEDED, [State.QUEUED])

    browser.get(f"{url}/#/jobs/with_board")
    find(browser, "#tensorboard-button").click()
    link = find(browser, "#tensorboard-link", "Open TensorBoard", timeout=WAIT * 2)
    board = link.get_attribute("href")
    assert board.startswith("http://127.0.0.1:") and str(job_dir) in link.get_attribute("title")
    with urllib.request.urlopen(board, timeout=30) as page:
        assert page.status == 200 and b"TensorBoard" in page.read()
    # Asked again, the same TensorBoard answers; closing the server stops it.
    again = app.handle(Request("POST", f"/v1/projects/{PROJECT}/jobs/with_board:tensorboard", body=b"{}"))
    assert again.code == 200 and again.body["url"] == board
    processes = [b.process for b in app._jobs._tensorboards._boards.values()]
    app.close()
    assert processes and all(process.poll() is not None for process in processes)


def test_tensorboard_is_refused_with_tokens_and_without_a_job_dir(api_home, tokens_file):
    seed("no_dir")
    path = f"/v1/projects/{PROJECT}/jobs/no_dir:tensorboard"
    open_app, token_app = App(Settings()), App(Settings(), load_tokens(tokens_file))
    answer = open_app.handle(Request("POST", path, body=b"{}"))
    assert answer.code == 400 and "has no jobDir" in answer.body["error"]["message"]
    answer = token_app.handle(Request("POST", path, body=b"{}", headers={"authorization": f"Bearer {WRITER_A}"}))
    assert answer.code == 400 and "without --tokens" in answer.body["error"]["message"]

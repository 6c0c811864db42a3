"""The console in a browser with real jobs on the engine: the jobs table, live logs, cancel, a
tuning job's trials."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from aiptrain.client import Client

import test_console
import test_rest_api_docker
from conftest import REPO, job_resources, wait_for
from test_console import WAIT, find, messages, rows
from test_rest_api import PROJECT, ml_api
from test_rest_api_docker import poll, training_body

# fixtures of the console's tests
api_home, browser, chromium, serve, tokens_file = (test_console.api_home, test_console.browser, test_console.chromium,
                                                  test_console.serve, test_console.tokens_file)

package_uri = test_rest_api_docker.package_uri


# The screenshots go to docs/images only when asked (`AIPTRAIN_SCREENSHOTS=docs`), so a test run
# leaves the checkout clean; otherwise beside the test's own files.
IMAGES = REPO / "docs" / "images"


HPTUNING_TRAINER = REPO / "sample_jobs" / "hptuning" / "trainer"


def screenshot(driver, name: str, most_height: int = 1800) -> None:
    """console-NAME.png (in docs/images with AIPTRAIN_SCREENSHOTS=docs): the whole page, up to
    `most_height` pixels, at the window's width."""
    width = driver.get_window_size()["width"]
    driver.set_window_size(width, 600)  # a taller window than the page would be measured as the page
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, min(max(height, 600), most_height))
    images = IMAGES if os.environ.get("AIPTRAIN_SCREENSHOTS") == "docs" else Path(tempfile.gettempdir())
    images.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(images / f"console-{name}.png"))


def test_jobs_table_filter_live_logs_and_cancel(serve, browser, package_uri, minimal_runtime, docker_api, tmp_path):
    url = serve()
    jobs = ml_api(url).projects().jobs()
    finished = training_body("console_done", package_uri, tmp_path / "done", "--steps", "5")
    jobs.create(parent=f"projects/{PROJECT}", body=finished).execute()
    assert poll(jobs, f"projects/{PROJECT}/jobs/console_done")["state"] == "SUCCEEDED"
    running = training_body("console_running", package_uri, tmp_path / "running", "--steps", "3000", "--sleep", "0.05")
    running["labels"] = {"via": "rest", "kind": "long"}
    jobs.create(parent=f"projects/{PROJECT}", body=running).execute()

    browser.get(url + "/")
    wait_for(lambda: rows(browser) == {"console_running": "RUNNING", "console_done": "SUCCEEDED"}, timeout=WAIT,
             what="a running and a finished job in the table (auto-refreshed)")
    screenshot(browser, "jobs")

    browser.find_element("id", "filter").send_keys("labels.kind=long")
    browser.find_element("css selector", "#filter-form button").click()
    wait_for(lambda: list(rows(browser)) == ["console_running"], timeout=WAIT, what="the filter to narrow the table")
    assert "filter=labels.kind%3Dlong" in browser.current_url

    find(browser, "#jobs-body a", "console_running").click()
    find(browser, "#job-details dt", "Created")
    # The replica prints a step line every 600 steps (30 s): the next one appears without a reload.
    wait_for(lambda: "Starting chief 0: 3000 steps" in messages(browser), timeout=WAIT, what="the replica's start")
    seen = set(messages(browser))
    wait_for(lambda: any(m.startswith("step ") and m not in seen for m in messages(browser)), timeout=WAIT * 3,
             what="a line the running replica printed after the page opened")
    screenshot(browser, "job")

    find(browser, "#job-cancel").click()
    find(browser, "#confirm-dialog", "Cancel job console_running?")
    browser.find_element("id", "confirm-yes").click()
    find(browser, "#job-state .state", "CANCELLED", timeout=WAIT * 2)
    assert jobs.get(name=f"projects/{PROJECT}/jobs/console_running").execute()["state"] == "CANCELLED"
    for job_id in ("console_done", "console_running"):
        wait_for(lambda job_id=job_id: not job_resources(docker_api, job_id), what=f"{job_id}'s containers to go")


def test_a_tuning_job_shows_its_trials_and_charts(serve, browser, api_home, minimal_runtime, docker_api, tmp_path):
    spec = {"goal": "MAXIMIZE", "hyperparameterMetricTag": "accuracy", "algorithm": "GRID_SEARCH",
            "maxTrials": 4, "maxParallelTrials": 4,
            "params": [{"parameterName": "learning_rate", "type": "DISCRETE", "discreteValues": [0.01, 0.1]},
                       {"parameterName": "optimizer", "type": "CATEGORICAL", "categoricalValues": ["adam", "sgd"]}]}
    config = tmp_path / "study.json"
    config.write_text(json.dumps({"trainingInput": {"hyperparameters": spec}}))
    with Client() as client:
        client.submit_training("console_study", package_path=HPTUNING_TRAINER, module_name="trainer.task",
                               job_dir=tmp_path / "study", config=config, runtime_version=minimal_runtime,
                               args=["--epochs", "2"])
        client.wait("console_study", timeout=300)
    url = serve()

    browser.get(f"{url}/#/jobs/console_study")
    find(browser, "#tuning-summary", "4 of 4 trials done")
    wait_for(lambda: len(browser.find_elements("css selector", "#chart-trials circle.point")) == 4, timeout=WAIT,
             what="a point per trial in the objective chart")
    assert len(browser.find_elements("css selector", "#chart-param-plot circle.point")) == 4
    assert browser.find_element("css selector", "#chart-trials path.best-line").get_attribute("d").startswith("M")
    best = find(browser, "#trials-table tr.best")
    assert "0.1" in best.text and "adam" in best.text  # the sample's best point
    assert len(browser.find_elements("css selector", "#trials-table tbody tr")) == 4
    screenshot(browser, "tuning")

    browser.set_window_size(390, 844)  # a phone
    browser.get(f"{url}/#/jobs/console_study")
    find(browser, "#chart-trials circle.point")
    screenshot(browser, "phone-job", most_height=2400)
    browser.get(f"{url}/#/")
    find(browser, "#jobs-body a", "console_study")
    screenshot(browser, "phone-jobs")
    wait_for(lambda: not job_resources(docker_api, "console_study"), what="the study's containers to go")

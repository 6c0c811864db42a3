"""How real jobs end: the last line without a newline reaches the logs, a job says it completed
exactly once even when its controller is killed at its end, and a job survives dockerd
restarting."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, _unavailable, job_resources, kill_controller, wait_for
from test_engine_names_and_scale import (
    CUSTOM,
    container_job,
    describe,
    home_resources,
    run_cli,
)

PROBE = Path(__file__).parents[1] / "trainers" / "probe"


# scripts/ensure-docker.sh writes dockerd's PID here when it started the engine itself.
DOCKERD_MARKER = Path(os.environ.get("AIPTRAIN_DOCKERD_MARKER", "/run/aiptrain-dockerd.pid"))


@pytest.mark.parametrize("expression, last_line", [("'the last words, without a newline'", "the last words, without a newline"),
                                                   ("'y' * 5_000_000", "y" * 5_000_000)], ids=["short", "5MB"])
def test_the_last_line_without_a_newline_reaches_the_logs_and_the_error_message(
    expression, last_line, tmp_path, minimal_runtime, home
):
    script = f"import sys; print('before', flush=True); sys.stderr.write({expression}); sys.exit(3)"
    result = run_cli(home, *container_job(tmp_path, "last_line", ["python3", "-c", script], tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    wait_for(lambda: describe(home, "last_line")["state"] == "FAILED", timeout=120, what="FAILED")
    logs = run_cli(home, "jobs", "stream-logs", "last_line").stdout
    assert f"\tmaster-replica-0\t\t{last_line}\n" in logs
    error = describe(home, "last_line")["errorMessage"]
    assert error.startswith("The replica master 0 exited with a non-zero status of 3.\n")
    assert f"before\n{last_line}\n" in error


def submit_five_replicas(home: Path, tmp_path: Path, job_id: str) -> None:
    """Master and 4 workers of the probe; the master ends after 2 s, the workers are stopped."""
    result = run_cli(home, "jobs", "submit", "training", job_id, "--package-path", str(PROBE),
                     "--module-name", "probe.task", "--job-dir", str(tmp_path / job_id),
                     "--runtime-version", "minimal", *CUSTOM, "--worker-count", "4",
                     "--", "--run", "chief=2", "--run", "worker=30")
    assert result.returncode == 0, result.stderr


def test_a_five_replica_job_says_it_completed_exactly_once(tmp_path, minimal_runtime, docker_api, home):
    jobs = [f"five_{i}" for i in range(3)]
    for job_id in jobs:
        submit_five_replicas(home, tmp_path, job_id)
    for job_id in jobs:
        logs = run_cli(home, "jobs", "stream-logs", job_id).stdout
        assert logs.count("Job completed successfully.") == 1, logs[-2000:]
        assert describe(home, job_id)["state"] == "SUCCEEDED"
        assert job_resources(docker_api, job_id) == []


def kill_controller_once(home: Path, tmp_path: Path, job_id: str, moment) -> None:
    """Submit five replicas, kill -9 the controller at `moment(job_id)` (a condition waited for),
    and check the job ends SUCCEEDED, says so once, and leaves nothing."""
    submit_five_replicas(home, tmp_path, job_id)
    wait_for(lambda: moment(job_id), timeout=120, interval=0.01, what="the moment to kill the controller")
    kill_controller(home)
    wait_for(lambda: describe(home, job_id)["state"] != "RUNNING", timeout=120, what="the end")
    assert describe(home, job_id)["state"] == "SUCCEEDED"
    assert (home / "logs" / f"{job_id}.jsonl").read_text().count("Job completed successfully.") == 1


def test_a_controller_killed_after_its_closing_line_is_not_followed_by_a_second_one(
    tmp_path, minimal_runtime, docker_api, home
):
    """How the line came twice: kill -9 of a controller between "Job completed successfully."
    and recording the state; its successor decided again. When the kill lands before the state
    is recorded (usually), the successor must keep the first word; after, nothing is left to do."""
    kill_controller_once(home, tmp_path, "five_killed", lambda job_id: "Job completed successfully." in (
        home / "logs" / f"{job_id}.jsonl").read_text())
    assert job_resources(docker_api, "five_killed") == []


def test_a_controller_killed_while_tearing_down_is_followed_by_the_same_ending(
    tmp_path, minimal_runtime, docker_api, home
):
    """The controller keeps its decision before it stops and removes the replicas: killed in the
    middle of that, its successor finishes the same ending instead of finding the master gone
    ("disappeared") and calling a finished job failed."""
    from aiptrain.store import JobStore

    def decided(job_id: str) -> bool:
        store = JobStore(home / "jobs.db")
        try:
            return store.verdict(job_id) is not None
        finally:
            store.close()

    kill_controller_once(home, tmp_path, "five_torn", decided)
    assert job_resources(docker_api, "five_torn") == []


def dockerd_started_by_the_suite() -> int | None:
    """The PID of a dockerd that scripts/ensure-docker.sh started (it leaves a marker), else None:
    only such an engine may be restarted; one that others use never is."""
    try:
        pid = int(DOCKERD_MARKER.read_text().strip())
        return pid if Path(f"/proc/{pid}/comm").read_text().strip() == "dockerd" else None
    except (OSError, ValueError):
        return None


def test_a_job_survives_dockerd_restarting(tmp_path, minimal_runtime, docker_api, home):
    pid = dockerd_started_by_the_suite()
    if pid is None:
        _unavailable(f"the Docker engine was not started by scripts/ensure-docker.sh (no {DOCKERD_MARKER}): "
                    "restarting an engine others use is not this suite's to do")
    result = run_cli(home, "jobs", "submit", "training", "engine_restart", "--package-path", str(PROBE),
                     "--module-name", "probe.task", "--job-dir", str(tmp_path / "out"),
                     "--runtime-version", minimal_runtime, *CUSTOM, "--worker-count", "1",
                     "--", "--run", "chief=25", "--run", "worker=25")
    assert result.returncode == 0, result.stderr
    log_file = home / "logs" / "engine_restart.jsonl"
    wait_for(lambda: "probe chief 0 started" in log_file.read_text(), timeout=120, what="the master training")
    os.kill(pid, signal.SIGTERM)
    try:
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=60, what="dockerd to stop")
    finally:  # an interrupted run leaves the engine up for the next one
        subprocess.run([str(REPO / "scripts" / "ensure-docker.sh")], check=True, timeout=120)
    wait_for(lambda: describe(home, "engine_restart")["state"] in ("SUCCEEDED", "FAILED"), timeout=240, what="the end")
    job = describe(home, "engine_restart")
    assert job["state"] == "SUCCEEDED", job.get("errorMessage")
    assert "Restarting it in place" in run_cli(home, "jobs", "stream-logs", "engine_restart").stdout
    assert home_resources(docker_api, home) == []

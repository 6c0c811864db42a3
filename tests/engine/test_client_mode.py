"""Client mode: the CLI with AIPTRAIN_API set (its own AIPTRAIN_HOME) against `aiptrain serve`
running as a process in another home, on the real engine; and a pipeline in the style of an
Airflow task (google-cloud-storage upload through STORAGE_EMULATOR_HOST, ml v1 create, poll,
logs through entries.list) against the same server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials

import test_client_mode_api
from conftest import SAMPLE_TRAINER, job_resources, wait_for
from test_rest_api import logging_api, ml_api
from test_rest_api_docker import poll

PROJECT = "aiptrain"  # the default project: what client and server agree on without --project
server = test_client_mode_api.server  # fixture: `aiptrain serve` as a process in its own home


# The CLI's own job tests, collected here again: their `cli` is this module's, in client mode
# against `server` (their `home` is the client's, which must stay empty of jobs). The server
# runs on this machine, so their local --job-dir paths are its paths too.
from test_jobs_docker import (  # noqa: E402,F401
    test_async_submit_returns_and_the_controller_finishes_the_job,
    test_basic_job_streams_logs_and_succeeds,
    test_broken_setup_py_fails_packaging_with_gclouds_text_and_no_trace,
    test_duplicate_job_id_exits_2_and_keeps_the_first_job,
    test_failing_trainer_fails_the_job_with_its_log_tail,
    test_invalid_job_ids_exit_2_with_one_line_and_no_trace,
    test_missing_image_is_an_environment_error_with_no_trace,
    test_missing_package_path_and_missing_init,
    test_replicas_are_unprivileged_and_see_the_package_read_only,
)


@pytest.fixture
def cli(server, home):
    """`aiptrain ARGS...` as a process in client mode (AIPTRAIN_API is the server's)."""

    def run(*args: str, timeout: float = 180, check_code: int | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run([sys.executable, "-m", "aiptrain", *args], capture_output=True, text=True,
                                timeout=timeout, env={**os.environ})
        if check_code is not None:
            assert result.returncode == check_code, (result.returncode, result.stdout, result.stderr)
        return result

    return run


def in_home(monkeypatch, server_home: Path):
    """Local mode on the server's own home: what the CLI prints there."""
    monkeypatch.setenv("AIPTRAIN_HOME", str(server_home))
    monkeypatch.delenv("AIPTRAIN_API")


def submit_args(job_id: str, *flags: str) -> list[str]:
    """`jobs submit training` of the sample trainer, staged to a gs:// bucket; trainer args follow.
    No --runtime-version: the server's default (AIPTRAIN_DEFAULT_RUNTIME=minimal) applies."""
    return ["jobs", "submit", "training", job_id, "--package-path", str(SAMPLE_TRAINER), "--module-name",
            "trainer.task", "--staging-bucket", "gs://team-bucket", "--job-dir", f"gs://team-bucket/out/{job_id}",
            *flags, "--"]


def test_the_cli_in_client_mode_submits_streams_describes_lists_and_relabels(server, run, minimal_runtime,
                                                                                docker_api, monkeypatch, home):
    code, out, err = run(*submit_args("remote_1", "--runtime-version", "minimal", "--stream-logs"), "--steps", "3")
    assert code == 0, err
    assert "Job [remote_1] submitted successfully." in err
    assert "master-replica-0\t\tStarting chief 0: 3 steps" in err
    assert "master-replica-0\t\tWrote model to gs://team-bucket/out/remote_1/model.json" in err
    assert "state: SUCCEEDED" in out
    # The package went through the server's Cloud Storage, into its home, where the job found it.
    staged = sorted((server.home / "gcs" / "team-bucket" / "remote_1").glob("*/trainer-0.0.0.tar.gz"))
    assert len(staged) == 1
    assert not (home / "jobs.db").exists()  # the client's home holds no job

    assert run("jobs", "update", "remote_1", "--update-labels", "team=ml,stage=dev")[0] == 0
    code, _, err = run("jobs", "update", "remote_1", "--update-labels", "team=ml")
    assert (code, err.strip()) == (0, "No update to perform.")
    assert run("jobs", "update", "remote_1", "--remove-labels", "stage")[0] == 0

    client_said = {args: run(*args)[:2] for args in [
        ("jobs", "describe", "remote_1"),
        ("jobs", "describe", "remote_1", "--format", "json"),
        ("jobs", "list"),
        ("jobs", "list", "--filter", "labels.team=ml", "--format", "value(jobId,labels)"),
        ("jobs", "stream-logs", "remote_1", "--task-name", "master-replica-0"),
    ]}
    in_home(monkeypatch, server.home)
    for args, said in client_said.items():
        assert run(*args)[:2] == said, args
    assert json.loads(client_said[("jobs", "describe", "remote_1", "--format", "json")][1])["labels"] == {
        "team": "ml"}
    wait_for(lambda: not job_resources(docker_api, "remote_1"), what="the job's containers to go")


def test_the_cli_in_client_mode_cancels_a_running_job(server, run, minimal_runtime, docker_api):
    code, _, err = run(*submit_args("remote_cancel"), "--steps", "1000", "--sleep", "1")
    assert code == 0, err
    wait_for(lambda: run("jobs", "describe", "remote_cancel", "--format", "value(state)")[1].strip() == "RUNNING",
             timeout=120, interval=0.5, what="RUNNING")
    assert run("jobs", "cancel", "remote_cancel")[0] == 0
    code, out, _ = run("jobs", "describe", "remote_cancel", "--format",
                       "value(state,errorMessage,trainingInput.runtimeVersion)")
    assert out.strip() == "CANCELLED\tJob cancelled by the user.\tminimal"
    assert run("jobs", "cancel", "remote_cancel")[0] == 0  # ended: left as it is, as in local mode
    wait_for(lambda: not job_resources(docker_api, "remote_cancel"), what="the job's containers to go")


def test_a_pipeline_uploads_creates_polls_and_reads_logs(server, minimal_runtime, docker_api, tmp_path, monkeypatch):
    """An Airflow task's steps, with the clients such tasks use, against `aiptrain serve`."""
    from google.cloud import storage

    from aiptrain.packaging import cached_sdist

    sdist = cached_sdist(SAMPLE_TRAINER, tmp_path / "cache").path
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)
    gcs = storage.Client(project=PROJECT, credentials=AnonymousCredentials())
    gcs.create_bucket("pipeline-bucket")
    gcs.bucket("pipeline-bucket").blob(f"packages/{sdist.name}").upload_from_filename(str(sdist))
    package = f"gs://pipeline-bucket/packages/{sdist.name}"

    jobs = ml_api(server.url).projects().jobs()
    jobs.create(parent=f"projects/{PROJECT}", body={
        "jobId": "pipeline_1", "trainingInput": {
            "scaleTier": "BASIC", "pythonModule": "trainer.task", "packageUris": [package], "region": "us-central1",
            "runtimeVersion": "minimal", "jobDir": "gs://pipeline-bucket/out", "args": ["--steps", "2"]}}).execute()
    done = poll(jobs, f"projects/{PROJECT}/jobs/pipeline_1")
    assert done["state"] == "SUCCEEDED", done
    entries = logging_api(server.url).entries().list(body={
        "resourceNames": [f"projects/{PROJECT}"], "orderBy": "timestamp asc",
        "filter": 'resource.type="ml_job" AND resource.labels.job_id="pipeline_1"'}).execute()["entries"]
    assert any(e["jsonPayload"]["message"] == "Wrote model to gs://pipeline-bucket/out/model.json" for e in entries)
    assert gcs.bucket("pipeline-bucket").blob(f"packages/{sdist.name}").download_as_bytes() == sdist.read_bytes()
    wait_for(lambda: not job_resources(docker_api, "pipeline_1"), what="the job's containers to go")



"""The Python client on the real engine: submit, wait, stream logs, cancel."""

from __future__ import annotations

from aiptrain.client import Client
from aiptrain.logs import LogRecord, format_record
from aiptrain.model import Job, State

from conftest import SAMPLE_TRAINER, job_resources, wait_for


def test_submit_wait_and_stream_logs(home, tmp_path, minimal_runtime):
    with Client() as client:
        job = client.submit_training(
            "api_job", package_path=SAMPLE_TRAINER, module_name="trainer.task", job_dir=tmp_path / "out",
            args=["--steps", "3"], runtime_version=minimal_runtime, region="us-central1", labels={"via": "api"},
        )
        assert isinstance(job, Job) and job.job_id == "api_job" and job.labels == {"via": "api"}
        records = list(client.stream_logs("api_job"))
        assert all(isinstance(r, LogRecord) for r in records)
        assert {"service", "master-replica-0"} <= {r.task for r in records}
        lines = [line for r in records for line in format_record(r)]
        assert any("\tmaster-replica-0\t\t" in line for line in lines)
        done = client.wait("api_job")
        assert done.state is State.SUCCEEDED and done.end_time is not None
        assert client.list(filter="labels.via=api")[0].job_id == "api_job"
        assert (tmp_path / "out").is_dir()


def test_cancel_and_wait_with_timeout(home, tmp_path, minimal_runtime, docker_api):
    with Client() as client:
        client.submit_training("api_cancel", package_path=str(SAMPLE_TRAINER), module_name="trainer.task",
                               job_dir=str(tmp_path / "out"), args=["--steps", "1000", "--sleep", "1"],
                               runtime_version=minimal_runtime)
        assert not client.wait("api_cancel", timeout=0).state.is_terminal  # returns at the deadline
        assert client.cancel("api_cancel").state is State.CANCELLED
        assert client.cancel("api_cancel").state is State.CANCELLED  # already ended: left as it is
    wait_for(lambda: not job_resources(docker_api, "api_cancel"), what="the cancelled job's containers to go")

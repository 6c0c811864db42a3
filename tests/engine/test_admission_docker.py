"""Admission on the real engine: with a cap, jobs wait in QUEUED and start in submission order;
maxWaitTime cancels one that waits too long; cancelling a queued job leaves nothing."""

from __future__ import annotations

import itertools
import uuid

import pytest
import yaml

from aiptrain.logs import SERVICE, read_records

from conftest import REPO, job_resources, kill_controller, wait_for

TUNER = REPO / "tests" / "trainers" / "tuner"

SHORT = ("--steps", "2", "--sleep", "1")  # a trainer of about two seconds
LONG = ("--steps", "600", "--sleep", "1")  # runs until cancelled


@pytest.fixture
def cap_of_one(monkeypatch):
    monkeypatch.setenv("AIPTRAIN_MAX_RUNNING_REPLICAS", "1")


@pytest.fixture
def client(home):
    from aiptrain.client import Client

    with Client(home) as client:
        yield client


def _state_printed(result) -> str:
    """The state in submit's summary (`jobId: ...`, `state: ...`)."""
    return next(line.split(":", 1)[1].strip() for line in result.stdout.splitlines() if line.startswith("state:"))


def test_jobs_over_the_cap_wait_and_start_in_submission_order(cli, submit_args, client, cap_of_one, docker_api):
    first = cli(*submit_args("first", user_args=("--steps", "8", "--sleep", "1")), check_code=0)
    later = [cli(*submit_args(job_id, user_args=SHORT), check_code=0) for job_id in ("second", "third")]
    assert _state_printed(first) != "QUEUED"
    assert [_state_printed(result) for result in later] == ["QUEUED", "QUEUED"]

    jobs = [wait_for(lambda j=j: (job := client.wait(j, timeout=1)).state.is_terminal and job, timeout=180,
                     what=f"{j} to end") for j in ("first", "second", "third")]
    assert [job.state for job in jobs] == ["SUCCEEDED"] * 3, [job.error_message for job in jobs]
    # One replica at a time: each started once the one before it had ended, in submission order.
    for before, after in itertools.pairwise(jobs):
        assert after.start_time >= before.end_time
    events = [state for _, state, _ in client.store.events("third")]
    assert events[:4] == ["QUEUED", "PREPARING", "RUNNING", "SUCCEEDED"]
    said = [r.message for r in read_records(client.settings.job_paths("third").log)[0] if r.task == SERVICE]
    assert said[said.index("Job third is queued.") + 1].startswith("Waiting behind 1 job submitted earlier")
    assert job_resources(docker_api, "second") == [] and job_resources(docker_api, "third") == []


def test_describe_cancel_and_max_wait_time_of_queued_jobs(cli, submit_args, client, cap_of_one, docker_api,
                                                          tmp_path):
    config = tmp_path / "wait.yaml"
    config.write_text("trainingInput:\n  scheduling:\n    maxWaitTime: 2s\n")
    cli(*submit_args("running", user_args=LONG), check_code=0)
    cli(*submit_args("waiting", user_args=SHORT), check_code=0)
    impatient = cli(*submit_args("impatient", "--config", str(config), user_args=SHORT), check_code=0)
    assert "maxWaitTime [2s] is below the service's minimum of 1800s" in impatient.stderr

    described = cli("jobs", "describe", "waiting", check_code=0)
    assert "state: QUEUED" in described.stdout and "jobPosition: '1'" in described.stdout
    assert "Queued (position 1): Waiting for capacity: 1 replica of other jobs running" in described.stderr
    assert "AIPTRAIN_MAX_RUNNING_REPLICAS=1" in described.stderr

    cli("jobs", "cancel", "waiting", check_code=0)
    job = client.get("waiting")
    assert job.state == "CANCELLED" and job.error_message == "Job cancelled by the user."
    assert job.start_time is None and job_resources(docker_api, "waiting") == []
    assert not client.settings.job_paths("waiting").work_dir.exists()

    expired = wait_for(lambda: (j := client.wait("impatient", timeout=1)).state.is_terminal and j, timeout=120,
                       what="maxWaitTime to cancel the job")
    assert expired.state == "CANCELLED" and expired.start_time is None
    assert expired.error_message.startswith("Job cancelled: it waited longer than scheduling.maxWaitTime (2s)")
    assert client.get("running").state == "RUNNING"  # the queue never touched the running job
    cli("jobs", "cancel", "running", check_code=0)
    assert job_resources(docker_api, "impatient") == [] and job_resources(docker_api, "running") == []


def test_a_queued_job_whose_controller_died_is_taken_over_and_still_runs(cli, submit_args, client, cap_of_one,
                                                                        docker_api, home):
    running, queued = (f"{name}_{uuid.uuid4().hex[:6]}" for name in ("running", "queued"))
    cli(*submit_args(running, user_args=LONG), check_code=0)
    cli(*submit_args(queued, user_args=SHORT), check_code=0)
    assert kill_controller(home) == 1

    described = cli("jobs", "describe", queued, check_code=0)  # a new controller takes both jobs on
    assert "state: QUEUED" in described.stdout
    cli("jobs", "cancel", running, check_code=0)
    job = client.wait(queued, timeout=120)
    assert job.state == "SUCCEEDED", job.error_message
    assert job_resources(docker_api, queued) == []


def test_a_study_waits_for_room_for_its_parallel_trials_then_runs_them(cli, submit_args, client, monkeypatch,
                                                                     minimal_runtime, tmp_path, docker_api):
    monkeypatch.setenv("AIPTRAIN_MAX_RUNNING_REPLICAS", "2")
    spec = {"goal": "MINIMIZE", "algorithm": "GRID_SEARCH", "maxTrials": 2, "maxParallelTrials": 2,
            "params": [{"parameterName": "n", "type": "INTEGER", "minValue": 1, "maxValue": 2}]}
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": spec}}))
    cli(*submit_args("plain", user_args=LONG), check_code=0)
    submitted = cli("jobs", "submit", "training", "study", "--config", str(config), "--package-path", str(TUNER),
                    "--module-name", "tuner.task", "--job-dir", str(tmp_path / "study"), "--region", "us-central1",
                    "--runtime-version", minimal_runtime, check_code=0)
    assert _state_printed(submitted) == "QUEUED"  # two trials of one replica do not fit beside `plain`
    cli("jobs", "cancel", "plain", check_code=0)
    job = client.wait("study", timeout=180)
    assert job.state == "SUCCEEDED", job.error_message
    assert job.training_output.completed_trial_count == 2
    assert job.start_time >= client.get("plain").end_time


def test_a_study_asking_more_trials_at_once_than_the_cap_runs_them_one_at_a_time(cli, client, cap_of_one,
                                                                                 minimal_runtime, tmp_path):
    """A published config's maxParallelTrials beyond this machine is accepted (it was exit 2): one
    warning line, the trials one at a time, the job as sent."""
    spec = {"goal": "MINIMIZE", "algorithm": "GRID_SEARCH", "maxTrials": 3, "maxParallelTrials": 3,
            "params": [{"parameterName": "n", "type": "INTEGER", "minValue": 1, "maxValue": 3}]}
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": spec}}))
    submitted = cli("jobs", "submit", "training", "wide", "--config", str(config), "--package-path", str(TUNER),
                    "--module-name", "tuner.task", "--job-dir", str(tmp_path / "wide"), "--region", "us-central1",
                    "--runtime-version", minimal_runtime, check_code=0)
    warning = ("WARNING: trainingInput.hyperparameters.maxParallelTrials [3]: this machine runs 1 of the study's "
               "trials at once (1 replica each; at most 1 replica at once: AIPTRAIN_MAX_RUNNING_REPLICAS=1), and "
               "starts its other trials as earlier ones end. Set AIPTRAIN_MAX_RUNNING_REPLICAS to change it (0: no cap).")
    assert [line for line in submitted.stderr.splitlines() if "maxParallelTrials" in line] == [warning]
    job = client.wait("wide", timeout=240)
    assert job.state == "SUCCEEDED", job.error_message
    trials = sorted(job.training_output.trials, key=lambda t: int(t.trial_id))
    assert [t.state for t in trials] == ["SUCCEEDED"] * 3
    for before, after in itertools.pairwise(trials):
        assert after.start_time >= before.end_time  # one at a time
    assert job.training_input.hyperparameters.max_parallel_trials == 3
    said = [r.message for r in read_records(client.settings.job_paths("wide").log)[0] if r.task == SERVICE]
    assert said.count(warning.removeprefix("WARNING: ")) == 1

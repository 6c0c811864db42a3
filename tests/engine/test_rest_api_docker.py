"""Jobs created, cancelled and run through the REST API on the real engine."""

from __future__ import annotations

import json
import time

import pytest

from aiptrain.api.access import load_tokens
from aiptrain.client import Client
from aiptrain.settings import Settings

import test_gcs
import test_rest_api
from conftest import SAMPLE_TRAINER, job_resources, wait_for
from test_rest_api import (
    GOOD_BODY,
    JOBS,
    OTHER,
    PROJECT,
    READER_A,
    WRITER_A,
    assert_refused_and_nothing_created,
    logging_api,
    ml_api,
    refused,
)

emulator, gcs = test_gcs.emulator, test_gcs.gcs  # fixtures: gcp-storage-emulator and a fresh bucket
api_home, serve, tokens_file = test_rest_api.api_home, test_rest_api.serve, test_rest_api.tokens_file  # the server's fixtures


@pytest.fixture
def package_uri(api_home, tmp_path, monkeypatch):
    """The sample trainer's sdist at a gs:// URI kept on this machine (AIPTRAIN_GCS=local)."""
    from aiptrain.packaging import cached_sdist

    monkeypatch.setenv("AIPTRAIN_GCS", "local")
    sdist = cached_sdist(SAMPLE_TRAINER, tmp_path / "cache").path
    target = Settings().gcs_root / "pipeline-bucket" / "packages" / sdist.name
    target.parent.mkdir(parents=True)
    target.write_bytes(sdist.read_bytes())
    return f"gs://pipeline-bucket/packages/{sdist.name}"


def training_body(job_id: str, package: str, job_dir, *args: str, **more) -> dict:
    return {"jobId": job_id, "labels": {"via": "rest"},
            "trainingInput": {"scaleTier": "BASIC", "pythonModule": "trainer.task", "packageUris": [package],
                              "region": "us-central1", "runtimeVersion": "minimal", "jobDir": str(job_dir),
                              "args": list(args), **more}}


def poll(jobs, name: str, timeout: float = 180) -> dict:
    """What a pipeline does: get until the job is done."""
    deadline = time.monotonic() + timeout
    while True:
        job = jobs.get(name=name).execute()
        if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") or time.monotonic() > deadline:
            return job
        time.sleep(0.5)


def test_a_job_created_through_the_api_runs_and_is_the_cli_s_job(serve, run, package_uri, minimal_runtime,
                                                                  tmp_path):
    url = serve()
    jobs = ml_api(url).projects().jobs()
    body = training_body("rest_basic", package_uri, tmp_path / "out", "--steps", "5")
    created = jobs.create(parent=f"projects/{PROJECT}", body=body).execute()
    assert created["jobId"] == "rest_basic" and created["trainingInput"]["packageUris"] == [package_uri]

    code, error = refused(jobs.create(parent=f"projects/{PROJECT}", body=body))
    assert (code, error["status"]) == (409, "ALREADY_EXISTS")

    done = poll(jobs, f"projects/{PROJECT}/jobs/rest_basic")
    assert done["state"] == "SUCCEEDED", done
    code, described, _ = run("jobs", "describe", "rest_basic", "--format", "json")
    assert {key: value for key, value in done.items() if key != "etag"} == json.loads(described)
    assert (tmp_path / "out" / "model.json").is_file()

    lines = logging_api(url).entries().list(body={
        "resourceNames": [f"projects/{PROJECT}"], "orderBy": "timestamp asc", "pageSize": 1000,
        "filter": 'resource.type="ml_job" AND resource.labels.job_id="rest_basic" AND '
                  'resource.labels.task_name="master-replica-0"'}).execute()["entries"]
    messages = [entry["jsonPayload"]["message"] for entry in lines]
    assert any(m.endswith(" 0: 5 steps") for m in messages) and any(m.startswith("Wrote model to") for m in messages)

    with Client() as client:  # and the other way round: a CLI job is the API's
        client.submit_training("cli_basic", package_path=SAMPLE_TRAINER, module_name="trainer.task",
                               job_dir=tmp_path / "cli-out", args=["--steps", "2"], runtime_version=minimal_runtime)
        client.wait("cli_basic", timeout=120)
    assert jobs.get(name=f"projects/{PROJECT}/jobs/cli_basic").execute()["state"] == "SUCCEEDED"
    listed = jobs.list(parent=f"projects/{PROJECT}", filter="labels.via=rest").execute()
    assert [job["jobId"] for job in listed["jobs"]] == ["rest_basic"]


def test_cancel_through_the_api_stops_a_running_job(serve, package_uri, minimal_runtime, docker_api, tmp_path):
    jobs = ml_api(serve()).projects().jobs()
    name = f"projects/{PROJECT}/jobs/rest_cancel"
    body = training_body("rest_cancel", package_uri, tmp_path / "out", "--steps", "1000", "--sleep", "1")
    jobs.create(parent=f"projects/{PROJECT}", body=body).execute()
    wait_for(lambda: jobs.get(name=name).execute()["state"] == "RUNNING", timeout=120, what="RUNNING")
    assert jobs.cancel(name=name, body={}).execute() == {}
    done = poll(jobs, name)
    assert done["state"] == "CANCELLED" and done["errorMessage"] == "Job cancelled by the user."
    wait_for(lambda: not job_resources(docker_api, "rest_cancel"), what="the cancelled job's containers to go")


def test_two_projects_run_a_job_of_one_id_side_by_side(serve, run, package_uri, minimal_runtime, docker_api, tmp_path,
                                                       monkeypatch):
    """Job IDs per project on the engine: team-a (the default project here, whose job keeps its ID
    as key) and team-b both run `census_1` at once, each with its own containers, network and log;
    a cancel stops only its own project's."""
    monkeypatch.setenv("AIPTRAIN_MAX_RUNNING_REPLICAS", "4")  # both at once, whatever the host's cores
    jobs = ml_api(serve()).projects().jobs()
    names = {project: f"projects/{project}/jobs/census_1" for project in (PROJECT, OTHER)}
    steps = {PROJECT: "1000", OTHER: "999"}
    for project in (PROJECT, OTHER):
        body = training_body("census_1", package_uri, tmp_path / project, "--steps", steps[project], "--sleep", "0.5",
                             scaleTier="CUSTOM", masterType="n1-standard-4", workerType="n1-standard-4", workerCount=1)
        created = jobs.create(parent=f"projects/{project}", body={**body, "labels": {"team": project}}).execute()
        assert created["jobId"] == "census_1"
    for name in names.values():
        wait_for(lambda name=name: jobs.get(name=name).execute()["state"] == "RUNNING", timeout=120, what="RUNNING")
    ours, theirs = job_resources(docker_api, "census_1"), job_resources(docker_api, f"{OTHER}--census_1")
    assert len(ours) == len(theirs) == 3 and not set(ours) & set(theirs)  # two replicas and a network each
    assert any(name.startswith(f"aiptrain-{OTHER}--census_1-") for name in theirs)

    def said(project: str) -> list[str]:
        return [entry["jsonPayload"]["message"] for entry in logging_api(serve()).entries().list(body={
            "resourceNames": [f"projects/{project}"], "pageSize": 1000,
            "filter": 'resource.type="ml_job" AND resource.labels.job_id="census_1"'}).execute().get("entries", [])]

    wait_for(lambda: f"Starting worker 0: {steps[OTHER]} steps" in said(OTHER), timeout=60, what="team-b's worker")
    assert not any(f": {steps[OTHER]} steps" in line for line in said(PROJECT))  # each log is its own job's

    assert jobs.cancel(name=names[OTHER], body={}).execute() == {}
    assert poll(jobs, names[OTHER])["state"] == "CANCELLED"
    wait_for(lambda: not job_resources(docker_api, f"{OTHER}--census_1"), what="team-b's containers to go")
    assert jobs.get(name=names[PROJECT]).execute()["state"] == "RUNNING" and job_resources(docker_api, "census_1")
    code, out, _ = run("--project", OTHER, "jobs", "describe", "census_1", "--format", "json")  # the CLI's too
    assert code == 0 and (json.loads(out)["state"], json.loads(out)["labels"]) == ("CANCELLED", {"team": OTHER})
    assert run("jobs", "cancel", "census_1")[0] == 0  # the default project's, team-a's
    assert poll(jobs, names[PROJECT])["state"] == "CANCELLED"
    wait_for(lambda: not job_resources(docker_api, "census_1"), what="team-a's containers to go")


def test_a_standard_1_job_and_a_tuning_job_through_the_api(serve, package_uri, minimal_runtime, docker_api,
                                                            tmp_path):
    jobs = ml_api(serve()).projects().jobs()
    cluster = training_body("rest_standard", package_uri, tmp_path / "standard", "--steps", "3",
                            scaleTier="STANDARD_1")
    spec = {"goal": "MAXIMIZE", "algorithm": "GRID_SEARCH", "maxTrials": 2, "maxParallelTrials": 2,
            "params": [{"parameterName": "learning-rate", "type": "DISCRETE", "discreteValues": [0.1, 0.05]}]}
    # The study as gcloud 528 posts a --config file written without `trainingInput:` (its fields
    # beside trainingInput), with its discreteValues as written: the service took both.
    study = {**training_body("rest_study", package_uri, tmp_path / "study", "--steps", "3"), "hyperparameters": spec}
    for body in (cluster, study):
        jobs.create(parent=f"projects/{PROJECT}", body=body).execute()

    done = poll(jobs, f"projects/{PROJECT}/jobs/rest_standard")
    assert done["state"] == "SUCCEEDED", done
    tasks = {entry["resource"]["labels"]["task_name"] for entry in logging_api(serve()).entries().list(body={
        "resourceNames": [f"projects/{PROJECT}"], "pageSize": 1000,
        "filter": 'resource.type="ml_job" AND resource.labels.job_id="rest_standard"'}).execute()["entries"]}
    assert {"master-replica-0", "worker-replica-3", "ps-replica-2", "service"} <= tasks

    done = poll(jobs, f"projects/{PROJECT}/jobs/rest_study")
    assert done["state"] == "SUCCEEDED", done
    output = done["trainingOutput"]
    assert output["isHyperparameterTuningJob"] and output["completedTrialCount"] == "2"
    assert sorted(t["hyperparameters"]["learning-rate"] for t in output["trials"]) == ["0.05", "0.1"]
    assert "hyperparameters" not in done and done["trainingInput"]["hyperparameters"]["params"][0][
        "discreteValues"] == [0.1, 0.05]  # under trainingInput, as sent
    for job_id in ("rest_standard", "rest_study"):
        wait_for(lambda job_id=job_id: not job_resources(docker_api, job_id), what=f"{job_id}'s containers to go")


def test_a_pipeline_uploads_its_package_to_cloud_storage_and_runs_it_with_a_token(
        serve, tokens_file, gcs, minimal_runtime, docker_api, tmp_path):
    """In the style of an Airflow task against a server with tokens: upload the sdist with
    google-cloud-storage (a storage emulator here), create with gs:// URIs, poll, read the logs."""
    from aiptrain.packaging import cached_sdist

    sdist = cached_sdist(SAMPLE_TRAINER, tmp_path / "cache").path
    gcs.client.bucket(gcs.bucket).blob(f"packages/{sdist.name}").upload_from_filename(str(sdist))
    url = serve(load_tokens(tokens_file))
    jobs = ml_api(url, WRITER_A).projects().jobs()
    body = training_body("rest_pipeline", f"gs://{gcs.bucket}/packages/{sdist.name}", f"gs://{gcs.bucket}/out",
                         "--steps", "3")
    jobs.create(parent=f"projects/{PROJECT}", body=body).execute()
    done = poll(ml_api(url, READER_A).projects().jobs(), f"projects/{PROJECT}/jobs/rest_pipeline")
    assert done["state"] == "SUCCEEDED", done
    entries = logging_api(url, READER_A).entries().list(body={
        "resourceNames": [f"projects/{PROJECT}"],
        "filter": 'resource.type="ml_job" AND resource.labels.job_id="rest_pipeline"'}).execute()["entries"]
    assert any(entry["jsonPayload"]["message"].startswith("Wrote model to") for entry in entries)
    assert done["trainingInput"]["packageUris"] == [f"gs://{gcs.bucket}/packages/{sdist.name}"]
    wait_for(lambda: not job_resources(docker_api, "rest_pipeline"), what="the job's containers to go")


def test_a_package_that_does_not_exist_is_refused_and_creates_nothing(serve, api_home):
    """One of the malformed requests (tests/cli/test_rest_api.py), here because the server reaches
    the engine before it looks for the package."""
    assert_refused_and_nothing_created(serve, api_home, "POST", JOBS, json.dumps(GOOD_BODY).encode(), {}, 400,
                                       "does not exist")

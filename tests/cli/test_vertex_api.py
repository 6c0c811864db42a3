"""Vertex AI's customJobs on `aiptrain serve`, driven by the real google-cloud-aiplatform SDK over
its REST transport (and raw HTTP for what the SDK never sends): get, list with filters and pages,
cancel and delete of store-seeded jobs (ended, so nothing reconciles them), and creates the
service refused, with nothing created. Real jobs run in tests/engine."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from google.api_core import exceptions as api_exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform
from google.cloud.aiplatform_v1.services.job_service import JobServiceClient

from aiptrain.client import Client
from aiptrain.model import Job, State
from aiptrain.settings import Settings
from aiptrain.vertex.records import CUSTOM_JOBS, VertexRecords

from test_rest_api import PROJECT, api_home, raw, serve  # noqa: F401

LOCATION = "us-central1"
SPEC = {"workerPoolSpecs": [{"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
                             "containerSpec": {"imageUri": "aiptrain/runtime:minimal", "command": ["true"]}}]}


def seed_custom_job(display_name: str, state: State = State.SUCCEEDED, labels: dict | None = None,
                    minutes_ago: int = 0, error: str | None = None) -> str:
    """An ended Vertex custom job, straight into the store: its record and its ml v1 job. Its numeric ID."""
    with Client(settings=Settings(), project=PROJECT) as client:
        records = VertexRecords(client.store)
        body = {"displayName": display_name, "jobSpec": SPEC, **({"labels": labels} if labels else {})}
        record = records.add(PROJECT, CUSTOM_JOBS, LOCATION, body)
        created = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=minutes_ago)
        client.store.create(Job(job_id=record.job_id, labels=labels, create_time=created), project=PROJECT)
        key = client.key(record.job_id)
        client.store.transition(key, state, [State.QUEUED], error)
        records.set_job_key(record, key)
        return record.id


@pytest.fixture
def sdk(serve):  # noqa: F811
    """The SDK pointed at a server of this test's home (its global configuration undone after:
    `aiplatform.init` is bound to the one configuration object at import)."""
    url = serve()
    config = aiplatform.initializer.global_config
    saved = dict(vars(config))
    aiplatform.init(project=PROJECT, location=LOCATION, api_endpoint=url, api_transport="rest",
                    credentials=AnonymousCredentials(), staging_bucket="gs://vertex-api-staging")
    yield url
    vars(config).clear()
    vars(config).update(saved)


def job_service(url: str) -> JobServiceClient:
    return JobServiceClient(credentials=AnonymousCredentials(), transport="rest",
                            client_options={"api_endpoint": url})


def name_of(numeric: str) -> str:
    return f"projects/{PROJECT}/locations/{LOCATION}/customJobs/{numeric}"


def test_get_answers_the_resource_as_the_service_did(sdk):
    numeric = seed_custom_job("census", labels={"team": "a"})
    job = aiplatform.CustomJob.get(name_of(numeric))
    assert job.display_name == "census" and job.state.name == "JOB_STATE_SUCCEEDED"
    resource = job.to_dict()
    assert resource["name"] == name_of(numeric) and resource["labels"] == {"team": "a"}
    pool = resource["jobSpec"]["workerPoolSpecs"][0]
    assert pool["diskSpec"] == {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 100}  # filled in, as the service does
    assert {"createTime", "endTime", "updateTime"} <= resource.keys()


def test_a_failed_job_carries_its_error_in_vertex_words(sdk):
    numeric = seed_custom_job("broken", State.FAILED,
                              error="The replica master 0 exited with a non-zero status of 1.")
    job = job_service(sdk).get_custom_job(name=name_of(numeric))
    assert job.error.code == 3
    assert "workerpool0" in job.error.message and "master" not in job.error.message


def test_list_filters_as_vertex_does(sdk):
    first = seed_custom_job("alpha", labels={"team": "a"}, minutes_ago=3)
    second = seed_custom_job("beta", State.FAILED, labels={"team": "b"}, minutes_ago=2)
    third = seed_custom_job("alpha", State.CANCELLED, minutes_ago=1)

    def listed(text: str | None) -> list[str]:
        return [job.resource_name.rsplit("/", 1)[1] for job in aiplatform.CustomJob.list(filter=text)]

    assert set(listed(None)) == {first, second, third}
    assert set(listed('display_name="alpha"')) == {first, third}
    assert listed('state="JOB_STATE_FAILED"') == [second]
    assert listed("labels.team=a") == [first]
    assert set(listed('NOT display_name="alpha" OR state="JOB_STATE_CANCELLED"')) == {second, third}


def test_list_pages_through_every_job_once(sdk):
    made = {seed_custom_job(f"job{index}", minutes_ago=index) for index in range(5)}
    pages = job_service(sdk).list_custom_jobs(
        request={"parent": f"projects/{PROJECT}/locations/{LOCATION}", "page_size": 2}).pages
    seen = [[job.name.rsplit("/", 1)[1] for job in page.custom_jobs] for page in pages]
    assert [len(page) for page in seen] == [2, 2, 1]
    assert {numeric for page in seen for numeric in page} == made


def test_delete_of_an_ended_job_answers_a_done_operation_and_forgets_it(sdk):
    numeric = seed_custom_job("done")
    job = aiplatform.CustomJob.get(name_of(numeric))
    job.delete()  # the SDK waits on the operation it gets back (operations.get)
    with pytest.raises(api_exceptions.NotFound):
        aiplatform.CustomJob.get(name_of(numeric))
    with Client(settings=Settings(), project=PROJECT) as client:
        assert client.store.key_of(PROJECT, f"custom_job_{numeric}") is None


def test_cancel_of_an_ended_job_is_refused_as_a_precondition(sdk):
    numeric = seed_custom_job("over")
    with pytest.raises(api_exceptions.BadRequest, match="JOB_STATE_SUCCEEDED"):
        job_service(sdk).cancel_custom_job(name=name_of(numeric))


def test_another_project_finds_no_job(sdk):
    numeric = seed_custom_job("mine")
    other = f"projects/someone-else/locations/{LOCATION}/customJobs/{numeric}"
    with pytest.raises(api_exceptions.NotFound):
        job_service(sdk).get_custom_job(name=other)


@pytest.mark.parametrize("body, words", [
    ({"jobSpec": SPEC}, "displayName is required"),
    ({"displayName": "x" * 129, "jobSpec": SPEC}, "at most 128"),
    ({"displayName": "x"}, "jobSpec is required"),
    ({"displayName": "x", "jobSpec": {"workerPoolSpecs": []}}, "workerPoolSpecs[0] is required"),
    ({"displayName": "x", "jobSpec": {"workerPoolSpecs": [{**SPEC["workerPoolSpecs"][0], "replicaCount": "2"}]}},
     "replicaCount must be 1"),
    ({"displayName": "x", "jobSpec": {"workerPoolSpecs": [{"replicaCount": 1, "machineSpec": {}}]}},
     "exactly one of containerSpec and pythonPackageSpec"),
    ({"displayName": "x", "jobSpec": {**SPEC, "baseOutputDirectory": {"outputUriPrefix": "/tmp/out"}}},
     "not a gs:// URI"),
    ({"displayName": "x", "jobSpec": {"workerPoolSpecs": [{"replicaCount": 1, "pythonPackageSpec": {
        "executorImageUri": "example.com/mine:1", "packageUris": ["gs://b/p.tar.gz"], "pythonModule": "t"}}]}},
     "not one of Vertex AI's prebuilt training images"),
    ({"displayName": "x", "jobSpec": {**SPEC, "wokerPoolSpecs": []}}, "wokerPoolSpecs"),
    ({"displayName": "x", "jobSpec": {"workerPoolSpecs": [{**SPEC["workerPoolSpecs"][0],
                                                          "machineSpec": {"acceleratorType": 99}}]}},
     "acceleratorType"),
])
def test_a_refused_create_says_why_in_one_line_and_creates_nothing(sdk, body, words):
    status, answer = raw(sdk, "POST", f"/v1/projects/{PROJECT}/locations/{LOCATION}/customJobs",
                         json.dumps(body).encode(), {"content-type": "application/json"})
    assert status == 400 and answer["error"]["status"] == "INVALID_ARGUMENT"
    assert words in answer["error"]["message"] and "\n" not in answer["error"]["message"]
    with Client(settings=Settings(), project=PROJECT) as client:
        assert VertexRecords(client.store).list(PROJECT, CUSTOM_JOBS) == []
        assert client.job_ids() == []


@pytest.mark.parametrize("path, status", [
    (f"/v1/projects/{PROJECT}/locations/{LOCATION}/customJobs/abc", 400),
    (f"/v1/projects/{PROJECT}/locations/{LOCATION}/customJobs/123", 404),
    (f"/v1/projects/{PROJECT}/locations/{LOCATION}/operations/123", 404),
    (f"/v1/projects/{PROJECT}/locations/{LOCATION}/datasets", 404),
    (f"/v1/projects/{PROJECT}/locations/US_CENTRAL/customJobs", 400),
])
def test_unknown_names_are_answered_as_the_service_does(sdk, path, status):
    assert raw(sdk, "GET", path)[0] == status


def test_a_record_whose_create_stopped_before_naming_its_job_still_shows_the_job(sdk):
    """A server stopped between queueing the job and writing its key into the record: the job is
    found by its ID, not shown QUEUED for ever."""
    numeric = seed_custom_job("interrupted", State.FAILED, error="The replica master 0 exited with a non-zero status of 1.")
    with Client(settings=Settings(), project=PROJECT) as client:
        client.store.execute("UPDATE vertex_resources SET job_key = NULL WHERE id = ?", (numeric,))
    job = job_service(sdk).get_custom_job(name=name_of(numeric))
    assert job.state.name == "JOB_STATE_FAILED" and "workerpool0-0" in job.error.message

"""Cloud Logging's entries.list for Vertex AI jobs, asked as gcloud's `ai custom-jobs stream-logs`
asks (google-api-python-client's logging v2, the filter of gcloud's log_util): the job named by
its numeric ID, tasks as `workerpoolN-I`, the service's lines in Vertex's words. A store-seeded
job and a log written here: no engine. Real jobs and the real gcloud: tests/engine/test_real_gcloud_vertex.py."""

from __future__ import annotations

from aiptrain.client import Client
from aiptrain.logs import JobLogWriter
from aiptrain.model import Job, State
from aiptrain.settings import Settings
from aiptrain.vertex.records import CUSTOM_JOBS, TUNING_JOBS, VertexRecords

from test_rest_api import OTHER, PROJECT, api_home, logging_api, raw, serve, write_log  # noqa: F401
from test_vertex_api import LOCATION, SPEC

STAMP = "2026-01-01T00:00:0{}Z"


def stream_logs_filter(numeric: str, task: str | None = None) -> str:
    """What gcloud's command_lib/ai/log_util.py sends, less LogFetcher's time bounds."""
    found = f'resource.type="ml_job" AND resource.labels.job_id="{numeric}"'
    return found + (f' AND resource.labels.task_name="{task}"' if task else "")


def seed_failed_job(error: str, kind: str = CUSTOM_JOBS) -> tuple[str, str]:
    """A failed Vertex job, straight into the store, whose error is `error` with `{job}` for its
    ml v1 job's ID (as the controller writes it): (its numeric ID, its job's key)."""
    with Client(settings=Settings(), project=PROJECT) as client:
        records = VertexRecords(client.store)
        record = records.add(PROJECT, kind, LOCATION, {"displayName": "failed", "jobSpec": SPEC})
        client.store.create(Job(job_id=record.job_id), project=PROJECT)
        key = client.key(record.job_id)
        client.store.transition(key, State.FAILED, [State.QUEUED], error.format(job=record.job_id))
        records.set_job_key(record, key)
        return record.id, key


def test_a_custom_job_s_entries_come_in_vertex_s_shape(serve):  # noqa: F811
    numeric, job_key = seed_failed_job("The replica worker 0 exited with a non-zero status of 2.")
    write_log(job_key, [
        (STAMP.format(1), "service", "INFO", f"Job custom_job_{numeric} is queued."),
        (STAMP.format(2), "master-replica-0", "INFO", "chief says replica master 0"),
        (STAMP.format(3), "worker-replica-0", "ERROR", "worker fails"),
        (STAMP.format(4), "service", "ERROR", "The replica worker 0 exited with a non-zero status of 2."),
    ])
    entries_api = logging_api(serve()).entries()

    def listed(text: str, project: str = PROJECT) -> list[dict]:
        body = {"resourceNames": [f"projects/{project}"], "filter": text, "orderBy": "timestamp asc"}
        return entries_api.list(body=body).execute().get("entries", [])

    entries = listed(stream_logs_filter(numeric))
    assert [(e["resource"]["labels"]["task_name"], e["jsonPayload"]["message"]) for e in entries] == [
        ("service", f"Job {numeric} is queued."),
        ("workerpool0-0", "chief says replica master 0"),  # a trainer's own words stay as it wrote them
        ("workerpool1-0", "worker fails"),
        ("service", "The replica workerpool1-0 exited with a non-zero status of 2."),
    ]
    assert entries[1]["resource"] == {"type": "ml_job", "labels": {"project_id": PROJECT, "job_id": numeric,
                                                                   "task_name": "workerpool0-0"}}
    worker = listed(stream_logs_filter(numeric, "workerpool1-0"))
    assert [e["jsonPayload"]["message"] for e in worker] == ["worker fails"]
    assert listed(stream_logs_filter(numeric, "worker-replica-0")) == []  # AI Platform's name is not Vertex's
    assert listed(stream_logs_filter(numeric), project=OTHER) == []
    assert listed(stream_logs_filter(str(int(numeric) + 1))) == []
    as_ml_job = listed(stream_logs_filter(f"custom_job_{numeric}"))  # the ml v1 job that runs it: AI Platform's
    assert as_ml_job[1]["resource"]["labels"]["task_name"] == "master-replica-0"


def test_a_failed_job_s_error_names_the_gcloud_command_that_streams_its_log(serve):  # noqa: F811
    numeric, _ = seed_failed_job("The replica master 0 exited with a non-zero status of 1.\n\nTo find out more "
                                 "about why your job exited please check the logs: aiptrain jobs stream-logs {job}")
    name = f"projects/{PROJECT}/locations/{LOCATION}/customJobs/{numeric}"
    status, job = raw(serve(), "GET", f"/v1/{name}")
    assert status == 200 and job["error"] == {"code": 3, "message": (
        "The replica workerpool0-0 exited with a non-zero status of 1.\n\nTo find out more about why your job "
        f"exited please check the logs: gcloud ai custom-jobs stream-logs {name}")}


def test_a_tuning_job_s_entries_name_their_trials(serve):  # noqa: F811
    """`gcloud ai hp-tuning-jobs stream-logs ID` sends the same filter with the tuning job's ID."""
    numeric, job_key = seed_failed_job("Trial 2 failed.", kind=TUNING_JOBS)
    with JobLogWriter(Settings().job_paths(job_key).log) as writer:
        writer.write("master-replica-0", "INFO", "trial one", STAMP.format(1), trial="1")
        writer.write("master-replica-0", "INFO", "trial two", STAMP.format(2), trial="2")
        writer.write("service", "INFO", f"Job hp_tuning_job_{numeric} is queued.", STAMP.format(0))
    body = {"resourceNames": [f"projects/{PROJECT}"], "filter": stream_logs_filter(numeric, "workerpool0-0")}
    found = logging_api(serve()).entries().list(body=body).execute()["entries"]
    assert [(e["labels"]["ml.googleapis.com/trial_id"], e["jsonPayload"]["message"]) for e in found] == [
        ("1", "trial one"), ("2", "trial two")]
    body["filter"] = stream_logs_filter(numeric, "service")
    service = logging_api(serve()).entries().list(body=body).execute()["entries"]
    assert [e["jsonPayload"]["message"] for e in service] == [f"Job {numeric} is queued."]

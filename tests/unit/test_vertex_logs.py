"""A Vertex AI job's log lines as Vertex's Cloud Logging entries read them (aiptrain.vertex.logs),
and the entries aiptrain.api.entries makes of them through its LogSource seam."""

import pytest

from aiptrain.api.entries import LogSource, entry_of
from aiptrain.vertex.logs import VertexLog, in_vertex_words
from aiptrain.vertex.records import CUSTOM_JOBS, PIPELINES, TUNING_JOBS, Record

NUMERIC = "1234567890123456789"


def record(kind: str = CUSTOM_JOBS, numeric: str = NUMERIC) -> Record:
    return Record("p", kind, numeric, "us-central1", "2026-01-01T00:00:00Z", {}, "p--custom_job_" + numeric)


CUSTOM_NAME = f"projects/p/locations/us-central1/customJobs/{NUMERIC}"


@pytest.mark.parametrize("kind, ml_job_id, text, expected", [
    (CUSTOM_JOBS, f"custom_job_{NUMERIC}", f"Job custom_job_{NUMERIC} is queued.", f"Job {NUMERIC} is queued."),
    (CUSTOM_JOBS, f"custom_job_{NUMERIC}", "The replica worker 1 exited with a non-zero status of 2.",
     "The replica workerpool1-1 exited with a non-zero status of 2."),
    (CUSTOM_JOBS, f"custom_job_{NUMERIC}",
     f"To find out more about why your job exited please check the logs: aiptrain jobs stream-logs custom_job_{NUMERIC}",
     f"To find out more about why your job exited please check the logs: gcloud ai custom-jobs stream-logs "
     f"{CUSTOM_NAME}"),
    (TUNING_JOBS, f"hp_tuning_job_{NUMERIC}", f"check the logs: aiptrain jobs stream-logs hp_tuning_job_{NUMERIC}",
     f"check the logs: gcloud ai hp-tuning-jobs stream-logs "
     f"projects/p/locations/us-central1/hyperparameterTuningJobs/{NUMERIC}"),
    # A pipeline's backing custom job: its log is the pipeline's ml v1 job's, streamed as the custom job.
    (CUSTOM_JOBS, "training_pipeline_42", "check the logs: aiptrain jobs stream-logs training_pipeline_42",
     f"check the logs: gcloud ai custom-jobs stream-logs {CUSTOM_NAME}"),
    (PIPELINES, "training_pipeline_42", "Job training_pipeline_42 is queued.", f"Job {NUMERIC} is queued."),
    # Only the whole ID: another job whose ID begins with this one's is left alone.
    (CUSTOM_JOBS, "custom_job_1", "custom_job_12 and custom_job_1.", f"custom_job_12 and {NUMERIC}."),
])
def test_messages_in_vertex_words(kind, ml_job_id, text, expected):
    assert in_vertex_words(text, ml_job_id, record(kind)) == expected


def test_service_lines_are_reworded_and_the_replicas_lines_kept_as_written():
    log = VertexLog(record(), f"custom_job_{NUMERIC}")
    assert log.message("service", "The replica master 0 exited with a non-zero status of 1.") == \
        "The replica workerpool0-0 exited with a non-zero status of 1."
    printed = f"replica master 0 of custom_job_{NUMERIC} on master-replica-0"  # the trainer's own words
    assert log.message("master-replica-0", printed) == printed
    assert [log.task_name(t) for t in ("master-replica-0", "worker-replica-3", "ps-replica-0",
                                       "evaluator-replica-1", "service")] == [
        "workerpool0-0", "workerpool1-3", "workerpool2-0", "workerpool3-1", "service"]


def test_an_entry_names_the_job_as_the_filter_did_and_its_task_as_the_source_does():
    log = VertexLog(record(), f"custom_job_{NUMERIC}")
    source = LogSource(log.job_key, log.task_name, log.message)
    line = {"time": "2026-01-01T00:00:01Z", "task": "worker-replica-0", "severity": "INFO", "message": "hi",
            "trial": "3"}
    entry = entry_of(line, "p", NUMERIC, 7, source)
    assert entry["resource"] == {"type": "ml_job", "labels": {"project_id": "p", "job_id": NUMERIC,
                                                              "task_name": "workerpool1-0"}}
    assert entry["logName"] == "projects/p/logs/workerpool1-0" and entry["jsonPayload"] == {"message": "hi"}
    assert entry["labels"] == {"ml.googleapis.com/task_name": "workerpool1-0", "ml.googleapis.com/trial_id": "3"}
    assert entry_of(line, "p", "census", 7)["resource"]["labels"]["task_name"] == "worker-replica-0"  # ml v1's

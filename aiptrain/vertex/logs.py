"""A Vertex AI job's log as Vertex's Cloud Logging entries read: `resource.labels.job_id` is the
resource's numeric ID, the tasks are `service` and `workerpoolN-I`, and the messages name the
replicas, the job and the command that streams its log in Vertex's words. This is what gcloud's
`ai custom-jobs stream-logs ID` and `ai hp-tuning-jobs stream-logs ID` ask for (log_util's
filter `resource.type="ml_job" AND resource.labels.job_id="ID"`) and print.

aiptrain.api.entries serves the entries; this module says whose log a numeric ID names and how
its lines read. The log is the ml v1 job's that runs the resource (its record's job key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiptrain.logs import SERVICE
from aiptrain.store import JobStore
from aiptrain.vertex.records import CUSTOM_JOBS, TUNING_JOBS, Record, VertexRecords
from aiptrain.vertex.translate import vertex_message, vertex_task_name

# The kinds whose numeric ID a log filter names, and gcloud's command group that streams them.
# A training pipeline's log is its backing custom job's (a record of kind customJobs).
STREAM_LOGS_GROUPS = {CUSTOM_JOBS: "custom-jobs", TUNING_JOBS: "hp-tuning-jobs"}


@dataclass(frozen=True)
class VertexLog:
    """The log of the resource `record`, run by the ml v1 job `ml_job_id`."""

    record: Record
    ml_job_id: str

    @property
    def job_key(self) -> str:
        assert self.record.job_key is not None  # find() gives only records whose job was queued
        return self.record.job_key

    @staticmethod
    def task_name(task: str) -> str:
        return vertex_task_name(task)

    def message(self, task: str, text: str) -> str:
        """The service's lines in Vertex's words; the replicas' as their programs wrote them."""
        return in_vertex_words(text, self.ml_job_id, self.record) if task == SERVICE else text


def find(store: JobStore, project: str, numeric: str) -> VertexLog | None:
    """The log that `resource.labels.job_id="<numeric>"` names in `project`; None when no custom
    job or tuning job of the project has that ID (or its job was never queued)."""
    if not numeric.isdigit():
        return None
    records = VertexRecords(store)
    for kind in STREAM_LOGS_GROUPS:
        record = records.get(project, kind, numeric)
        if record is not None and record.job_key:
            job = store.get(record.job_key)
            return VertexLog(record, job.job_id) if job is not None else None
    return None


def in_vertex_words(text: str, ml_job_id: str, record: Record) -> str:
    """A line or error message of the ml v1 job `ml_job_id` as Vertex words it for `record`: the
    replicas by pool (`workerpool0-0`), the job by its numeric ID, and the logs to read named by
    the gcloud command that streams them (the service's own message gives a console link)."""
    text = vertex_message(text)
    group = STREAM_LOGS_GROUPS.get(record.kind)
    if group:
        text = text.replace(f"aiptrain jobs stream-logs {ml_job_id}", f"gcloud ai {group} stream-logs {record.name}")
    return re.sub(rf"\b{re.escape(ml_job_id)}\b", record.id, text)

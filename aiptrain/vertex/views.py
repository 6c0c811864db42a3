"""Vertex AI's resources as the service answered them, made from a record (what the client
gave) and the ml v1 job that runs it (state, times, error, trials). Pure: no I/O."""

from __future__ import annotations

from typing import Any

from aiptrain.model import Job, rfc3339
from aiptrain.states import State
from aiptrain.vertex.logs import in_vertex_words
from aiptrain.vertex.records import Record
from aiptrain.vertex.resources import JobState, StudySpec
from aiptrain.vertex.study import trial_resources
from aiptrain.vertex.translate import vertex_message, vertex_task_name

JOB_STATES = {
    State.STATE_UNSPECIFIED: JobState.JOB_STATE_UNSPECIFIED,
    State.QUEUED: JobState.JOB_STATE_QUEUED,
    State.PREPARING: JobState.JOB_STATE_PENDING,
    State.RUNNING: JobState.JOB_STATE_RUNNING,
    State.SUCCEEDED: JobState.JOB_STATE_SUCCEEDED,
    State.FAILED: JobState.JOB_STATE_FAILED,
    State.CANCELLING: JobState.JOB_STATE_CANCELLING,
    State.CANCELLED: JobState.JOB_STATE_CANCELLED,
}
# google.rpc.Code of a job's `error`: CANCELLED (1) for a cancelled job, as the service sets it;
# INVALID_ARGUMENT (3) for a trainer that failed, which the service gave for a replica's non-zero
# exit; DEADLINE_EXCEEDED (4) for a job past its scheduling.timeout or maxWaitDuration; INTERNAL
# (13) for anything else that ended it.
CANCELLED_CODE, TRAINER_FAILED_CODE, DEADLINE_CODE, INTERNAL_CODE = 1, 3, 4, 13
DEADLINES = ("scheduling.timeout", "scheduling.maxWaitDuration")
# What the service fills in that a client may leave out.
DEFAULT_DISK = {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 100}


def job_state(job: Job | None) -> JobState:
    if job is None or job.state is None:
        return JobState.JOB_STATE_QUEUED
    return JOB_STATES[job.state]


def with_defaults(job_spec: dict[str, Any]) -> dict[str, Any]:
    """A job spec as the service stores it: every pool that runs replicas with its disk and
    replica count, empty placeholder pools kept as they are."""
    pools = [{"replicaCount": "1", "diskSpec": dict(DEFAULT_DISK), **pool}
             if pool.get("containerSpec") or pool.get("pythonPackageSpec") else pool
             for pool in job_spec.get("workerPoolSpecs") or []]
    return {**job_spec, "workerPoolSpecs": pools} if "workerPoolSpecs" in job_spec else dict(job_spec)


def error_of(job: Job | None, record: Record | None = None) -> dict[str, Any] | None:
    """The resource's `error`, worded as Vertex words it (for `record`: naming its ID and the
    gcloud command that streams its log)."""
    if job is None or job.state not in (State.FAILED, State.CANCELLED):
        return None
    if job.state is State.CANCELLED:
        return {"code": CANCELLED_CODE, "message": "CANCELED"}
    given = job.error_message or "The job failed."
    message = in_vertex_words(given, job.job_id, record) if record else vertex_message(given)
    first_line = message.split("\n", 1)[0]
    if "non-zero status" in first_line:
        code = TRAINER_FAILED_CODE
    elif any(limit in first_line for limit in DEADLINES):
        code = DEADLINE_CODE
    else:
        code = INTERNAL_CODE
    return {"code": code, "message": message}


def times(record: Record, job: Job | None) -> dict[str, str]:
    """createTime, startTime, endTime and updateTime: the latest of them."""
    found = {"createTime": record.create_time}
    if job is not None:
        if job.start_time:
            found["startTime"] = rfc3339(job.start_time)
        if job.end_time:
            found["endTime"] = rfc3339(job.end_time)
    found["updateTime"] = max(found.values())
    return found


def custom_job(record: Record, job: Job | None) -> dict[str, Any]:
    body = record.body
    resource: dict[str, Any] = {"name": record.name, "displayName": body.get("displayName", "")}
    resource["jobSpec"] = with_defaults(body.get("jobSpec") or {})
    resource["state"] = job_state(job).name
    resource.update(times(record, job))
    error = error_of(job, record)
    if error:
        resource["error"] = error
    for field in ("labels", "encryptionSpec"):
        if body.get(field):
            resource[field] = body[field]
    uris = job.training_output.web_access_uris if job and job.training_output else None
    if uris:
        resource["webAccessUris"] = {vertex_task_name(task): uri for task, uri in uris.items()}
    return resource


def tuning_job(record: Record, job: Job | None) -> dict[str, Any]:
    """A HyperparameterTuningJob: what its client gave (counts as given, the trial job spec with
    the service's defaults), its job's state and times, and its trials (aiptrain.vertex.study)."""
    body = record.body
    resource: dict[str, Any] = {"name": record.name, "displayName": body.get("displayName", "")}
    for field in ("studySpec", "maxTrialCount", "parallelTrialCount", "maxFailedTrialCount"):
        if body.get(field):
            resource[field] = body[field]
    resource["trialJobSpec"] = with_defaults(body.get("trialJobSpec") or {})
    output = job.training_output if job else None
    if output and output.trials:
        resource["trials"] = trial_resources(StudySpec.model_validate(body.get("studySpec") or {}), output.trials)
    resource["state"] = job_state(job).name
    resource.update(times(record, job))
    error = error_of(job)
    if error:
        resource["error"] = error
    for field in ("labels", "encryptionSpec"):
        if body.get(field):
            resource[field] = body[field]
    return resource

"""aiplatform v1 custom training over aiptrain.client.Client: `projects.locations.customJobs`
(and, through the same door, the other kinds of aiptrain.vertex) on the server that answers
ml v1, with the same tokens, projects, store and controller.

A create translates the resource into the ml v1 job that runs it (aiptrain.vertex.translate),
records what only Vertex's resource has (aiptrain.vertex.records) and queues the job as the ml v1
create does: the answer comes at once, JOB_STATE_QUEUED or PENDING, and the job starts in the
background. Deletes answer with a long-running operation that is already done, which
`operations.get` returns.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic import ValidationError as PydanticError
from pydantic.alias_generators import to_camel

from aiptrain import filtering
from aiptrain import jobs as job_files
from aiptrain.api.calls import ApiError, Call
from aiptrain.api.jobs import JobMethods
from aiptrain.client import Client
from aiptrain.config import SubmitFlags, pydantic_error_line
from aiptrain.errors import ValidationError
from aiptrain.model import Job, rfc3339, utc_now
from aiptrain.runtimes import mapped as mapped_runtimes
from aiptrain.settings import Settings
from aiptrain.vertex import views
from aiptrain.vertex.records import CUSTOM_JOBS, OPERATIONS, Record, VertexRecords, new_id, resource_name
from aiptrain.vertex.resources import CustomJob
from aiptrain.vertex.translate import Translation, translate

log = logging.getLogger("aiptrain.api")
LIST_PAGE_SIZE, LIST_MOST = 100, 1000
DISPLAY_NAME_MOST = 128
EMPTY = "type.googleapis.com/google.protobuf.Empty"
DELETE_METADATA = "type.googleapis.com/google.cloud.aiplatform.v1.DeleteOperationMetadata"
# The Vertex kinds' singular names, as the service's messages say them.
SINGULAR = {CUSTOM_JOBS: "CustomJob"}


def parse_body(model: type[BaseModel], body: dict, what: str) -> Any:
    try:
        return model.model_validate(body)
    except PydanticError as exc:
        raise ApiError(400, pydantic_error_line(exc, what)) from None


@dataclass(frozen=True)
class Kind:
    """A collection of projects.locations (customJobs, ...): how a create makes one, and how a
    record and its job are shown. get, list, cancel and delete are the same for every kind."""

    create: Callable[..., dict]
    render: Callable[[Record, Job | None], dict]
    cancels: bool = True  # has a :cancel method


class VertexMethods:
    def __init__(self, settings: Settings, ml_jobs: JobMethods):
        self.settings = settings
        self._ml_jobs = ml_jobs  # the checks a create shares with ml v1's (runtime images, host paths)
        self.kinds: dict[str, Kind] = {
            CUSTOM_JOBS: Kind(self.create_custom_job, views.custom_job),
        }

    @contextmanager
    def _client(self, project: str) -> Iterator[tuple[Client, VertexRecords]]:
        with Client(settings=self.settings, project=project) as client:
            yield client, VertexRecords(client.store)

    # -- customJobs -------------------------------------------------------------------------

    def create_custom_job(self, call: Call, project: str, location: str) -> dict:
        call.accept()
        call.authorize(project, write=True)
        body = call.json_body()
        resource: CustomJob = parse_body(CustomJob, _without_output(body), "CustomJob")
        _check_display_name(resource.display_name)
        if resource.job_spec is None:
            raise ApiError(400, "CustomJob.jobSpec is required: give its workerPoolSpecs.")
        given = resource.to_resource()
        numeric = new_id()
        with self._client(project) as (client, records):
            translation = translate(f"custom_job_{numeric}", numeric, resource.job_spec, resource.labels,
                                    mapped_runtimes=mapped_runtimes(self.settings.home))
            record, job = self.queue(call, client, records, project, location, CUSTOM_JOBS, given, translation,
                                     numeric)
            return views.custom_job(record, job)

    def queue(self, call: Call, client: Client, records: VertexRecords, project: str, location: str, kind: str,
              body: dict, translation: Translation, numeric: str) -> tuple[Record, Job]:
        """Queue the ml v1 job of a translated resource and record the resource: the record first,
        so that the job is never seen without it; removed again when the job is refused."""
        job = translation.job
        self._ml_jobs.check_host_paths(call, job)
        submission = client.prepare(SubmitFlags(job_id=job.job_id, project=project), base=job)
        submission = dataclasses.replace(submission, shared_buckets=call.access.shared_with(project),
                                         contract=translation.contract, rules=translation.rules,
                                         notices=submission.notices + translation.notices)
        self._ml_jobs.check_runtime_image(submission)
        record = records.add(project, kind, location, body, numeric_id=numeric)
        try:
            queued = client.queue(submission)
        except BaseException:
            records.delete(record)
            raise
        return records.set_job_key(record, client.key(job.job_id)), queued

    def get(self, kind: str, render: Callable[[Record, Job | None], dict]) -> Callable[..., dict]:
        def get(call: Call, project: str, location: str, numeric: str) -> dict:
            call.accept()
            call.authorize(project, write=False)
            with self._client(project) as (client, records):
                record = _find(records, project, location, kind, numeric)
                return render(record, _job_of(client, record))
        return get

    def list(self, kind: str, render: Callable[[Record, Job | None], dict]) -> Callable[..., dict]:
        def list_(call: Call, project: str, location: str) -> dict:
            call.accept("filter", "pageSize", "pageToken", "readMask")
            call.authorize(project, write=False)
            page_size = call.int_param("pageSize", LIST_PAGE_SIZE, LIST_MOST)
            offset = _decode_token(call.params.get("pageToken") or "")
            expr = _vertex_filter(call.params.get("filter") or "")
            with self._client(project) as (client, records):
                found = [render(record, _job_of(client, record))
                         for record in records.list(project, kind, _location(location))]
            matching = [item for item in found if filtering.evaluate(expr, item)]
            page = matching[offset:offset + page_size]
            answer: dict[str, Any] = {kind: page} if page else {}
            if offset + page_size < len(matching):
                answer["nextPageToken"] = _encode_token(offset + page_size)
            return answer
        return list_

    def cancel(self, kind: str) -> Callable[..., dict]:
        def cancel(call: Call, project: str, location: str, numeric: str) -> dict:
            call.accept()
            call.authorize(project, write=True)
            call.json_body()
            with self._client(project) as (client, records):
                record = _find(records, project, location, kind, numeric)
                job = _job_of(client, record)
                if job is None or (job.state is not None and job.state.is_terminal):
                    state = views.job_state(job).name
                    raise ApiError(400, f"Cannot cancel {SINGULAR.get(kind, kind)} [{record.name}] in state "
                                   f"{state}: only a job that has not ended can be cancelled.", "FAILED_PRECONDITION")
                client.cancel(record.job_id, timeout=0)  # answered at once; the job ends CANCELLED soon
            return {}
        return cancel

    def delete(self, kind: str) -> Callable[..., dict]:
        def delete(call: Call, project: str, location: str, numeric: str) -> dict:
            call.accept()
            call.authorize(project, write=True)
            with self._client(project) as (client, records):
                record = _find(records, project, location, kind, numeric)
                job = _job_of(client, record)
                if job is not None and job.state is not None and not job.state.is_terminal:
                    raise ApiError(400, f"{SINGULAR.get(kind, kind)} [{record.name}] is "
                                   f"{views.job_state(job).name}: cancel it first; only an ended job can be "
                                   "deleted.", "FAILED_PRECONDITION")
                if record.job_key and job is not None:
                    job_files.forget(record.job_key, self.settings, client.store)
                records.delete(record)
                return self._done_operation(records, project, record.location, record.name)
        return delete

    def _done_operation(self, records: VertexRecords, project: str, location: str, target: str) -> dict:
        now = rfc3339(utc_now())
        numeric = new_id()
        operation = {
            "name": resource_name(project, location, OPERATIONS, numeric),
            "metadata": {"@type": DELETE_METADATA, "genericMetadata": {"createTime": now, "updateTime": now}},
            "done": True,
            "response": {"@type": EMPTY},
        }
        records.add(project, OPERATIONS, location, operation, numeric_id=numeric)
        log.info("deleted %s", target)
        return operation

    def get_operation(self, call: Call, project: str, location: str, numeric: str) -> dict:
        call.accept()
        call.authorize(project, write=False)
        with self._client(project) as (_, records):
            record = records.get(project, OPERATIONS, numeric)
            if record is None or record.location != location:
                raise ApiError(404, f"Operation [{resource_name(project, location, OPERATIONS, numeric)}] "
                               "is not found.")
            return record.body


def _without_output(body: dict) -> dict:
    """The fields a client may send but the service sets (a resource read back and created again)."""
    output = ("name", "state", "createTime", "startTime", "endTime", "updateTime", "error", "webAccessUris",
              "trials", "satisfiesPzs", "satisfiesPzi", "trainingTaskMetadata", "modelId")
    return {key: value for key, value in body.items() if key not in output}


def _check_display_name(name: str | None) -> None:
    if not name:
        raise ApiError(400, "displayName is required: name the job (at most 128 characters).")
    if len(name) > DISPLAY_NAME_MOST:
        raise ApiError(400, f"displayName is {len(name)} characters long; at most {DISPLAY_NAME_MOST} are allowed.")


def _location(location: str) -> str | None:
    return None if location == "-" else location


def _find(records: VertexRecords, project: str, location: str, kind: str, numeric: str) -> Record:
    record = records.get(project, kind, numeric)
    if record is None or _location(location) not in (None, record.location):
        raise ApiError(404, f"The {SINGULAR.get(kind, kind)} does not exist: "
                       f"{resource_name(project, location, kind, numeric)}.")
    return record


def _job_of(client: Client, record: Record) -> Job | None:
    if not record.job_key:
        return None
    return client.store.get(record.job_key)


def _vertex_filter(text: str) -> filtering.Expr | None:
    """Vertex's list filter (`display_name="x" AND state="JOB_STATE_SUCCEEDED"`, `labels.k=v`,
    `create_time>"..."`, NOT/OR) as the filter gcloud's lists use, on the resource's camelCase keys."""
    if not text.strip():
        return None
    try:
        return _camel_keys(filtering.parse(text))
    except ValidationError as exc:
        raise ApiError(400, f"Invalid filter [{text}]: {exc}") from None


def _camel_keys(expr: filtering.Expr) -> filtering.Expr:
    if isinstance(expr, filtering.Term):
        if expr.key is None or expr.key.startswith("labels."):
            return expr
        return dataclasses.replace(expr, key=".".join(to_camel(part) for part in expr.key.split(".")))
    if isinstance(expr, filtering.Not):
        return filtering.Not(_camel_keys(expr.operand))
    return filtering.BoolOp(expr.op, tuple(_camel_keys(operand) for operand in expr.operands))


def _encode_token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


def _decode_token(token: str) -> int:
    if not token:
        return 0
    try:
        offset = json.loads(base64.urlsafe_b64decode(token.encode()))["offset"]
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ApiError(400, f"Invalid pageToken [{token}]: pass the nextPageToken of the previous page.") from None
    if not isinstance(offset, int) or offset < 0:
        raise ApiError(400, f"Invalid pageToken [{token}]: pass the nextPageToken of the previous page.")
    return offset



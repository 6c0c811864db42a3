"""aiplatform v1 custom training over aiptrain.client.Client: `projects.locations.customJobs`
(and, through the same door, the other kinds of aiptrain.vertex) on the server that answers
ml v1, with the same tokens, projects, store and controller.

A create translates the resource into the ml v1 job that runs it (aiptrain.vertex.translate),
records what only Vertex's resource has (aiptrain.vertex.records) and queues the job as the ml v1
create does: the answer comes at once, JOB_STATE_QUEUED or PENDING, and the job starts in the
background. Deletes answer with a long-running operation that is already done, which
`operations.get` returns. What the service did when a job ended (a trainingPipeline uploading its
Model) is done by the first read after it (`Kind.refresh`).
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
from aiptrain.api.entries import LogSource
from aiptrain.api.jobs import JobMethods
from aiptrain.client import Client
from aiptrain.config import SubmitFlags, pydantic_error_line
from aiptrain.errors import ValidationError
from aiptrain.model import Job, rfc3339, utc_now
from aiptrain.runtimes import mapped as mapped_runtimes
from aiptrain.settings import Settings
from aiptrain.states import State
from aiptrain.storage import gcs_root_for, local_gcs_path
from aiptrain.vertex import logs as vertex_logs
from aiptrain.vertex import pipelines, views
from aiptrain.vertex.records import (
    CUSTOM_JOBS,
    JOB_PREFIX,
    MODELS,
    OPERATIONS,
    PIPELINES,
    TUNING_JOBS,
    Record,
    VertexRecords,
    new_id,
    resource_name,
)
from aiptrain.vertex.resources import CustomJob, HyperparameterTuningJob
from aiptrain.vertex.study import translate_tuning_job
from aiptrain.vertex.translate import Translation, translate

log = logging.getLogger("aiptrain.api")
LIST_PAGE_SIZE, LIST_MOST = 100, 1000
DISPLAY_NAME_MOST = 128
EMPTY = "type.googleapis.com/google.protobuf.Empty"
DELETE_METADATA = "type.googleapis.com/google.cloud.aiplatform.v1.DeleteOperationMetadata"
# The Vertex kinds' singular names, as the service's messages say them.
SINGULAR = {CUSTOM_JOBS: "CustomJob", TUNING_JOBS: "HyperparameterTuningJob", PIPELINES: "TrainingPipeline",
            MODELS: "Model"}


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
    # What a read of the kind brings up to date first, given the client, the records and the
    # project (a succeeded pipeline's Model is uploaded then).
    refresh: Callable[[Client, VertexRecords, str], None] | None = None
    # Named by the client too (a Model's modelId), and read by version: `ID@1`, `ID@default`.
    named_ids: bool = False


class VertexMethods:
    def __init__(self, settings: Settings, ml_jobs: JobMethods):
        self.settings = settings
        self._ml_jobs = ml_jobs  # the checks a create shares with ml v1's (runtime images, host paths)
        self.kinds: dict[str, Kind] = {
            CUSTOM_JOBS: Kind(self.create_custom_job, views.custom_job),
            TUNING_JOBS: Kind(self.create_tuning_job, views.tuning_job),
            PIPELINES: Kind(self.create_training_pipeline, pipelines.training_pipeline, refresh=self.upload_models),
            MODELS: Kind(self.upload_model, pipelines.model, cancels=False, refresh=self.upload_models,
                         named_ids=True),
        }

    @contextmanager
    def _client(self, project: str) -> Iterator[tuple[Client, VertexRecords]]:
        with Client(settings=self.settings, project=project, store=self._ml_jobs.stores.get()) as client:
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

    # -- hyperparameterTuningJobs ------------------------------------------------------------

    def create_tuning_job(self, call: Call, project: str, location: str) -> dict:
        """A study run as the ml v1 tuning job `hp_tuning_job_<id>` (aiptrain.vertex.study)."""
        call.accept()
        call.authorize(project, write=True)
        body = call.json_body()
        resource: HyperparameterTuningJob = parse_body(HyperparameterTuningJob, _without_output(body),
                                                       "HyperparameterTuningJob")
        _check_display_name(resource.display_name)
        numeric = new_id()
        with self._client(project) as (client, records):
            translation = translate_tuning_job(JOB_PREFIX[TUNING_JOBS] + numeric, numeric, resource,
                                               mapped_runtimes(self.settings.home))
            record, job = self.queue(call, client, records, project, location, TUNING_JOBS,
                                     resource.to_resource(), translation, numeric)
            return views.tuning_job(record, job)

    # -- trainingPipelines and the Models they upload ------------------------------------------

    def create_training_pipeline(self, call: Call, project: str, location: str) -> dict:
        """A pipeline of the custom task: its backing CustomJob recorded first, then the pipeline
        with the ml v1 job both share (aiptrain.vertex.pipelines)."""
        call.accept()
        call.authorize(project, write=True)
        body = call.json_body()
        pipeline: pipelines.TrainingPipeline = parse_body(pipelines.TrainingPipeline, pipelines.without_output(body),
                                                          "TrainingPipeline")
        _check_display_name(pipeline.display_name)
        spec = pipelines.custom_task(pipeline)
        numeric, backing_id = new_id(), new_id()
        with self._client(project) as (client, records):
            if pipeline.model_id and records.get(project, MODELS, pipeline.model_id) is not None:
                raise ApiError(409, f"Model [{resource_name(project, location, MODELS, pipeline.model_id)}] already "
                               "exists: give another modelId, or leave it out for a number.")
            translation = translate(f"training_pipeline_{numeric}", backing_id, spec, pipeline.labels,
                                    where="trainingTaskInputs", mapped_runtimes=mapped_runtimes(self.settings.home))
            backing = records.add(project, CUSTOM_JOBS, location, pipelines.backing_custom_job(pipeline, spec),
                                  numeric_id=backing_id)
            try:
                record, job = self.queue(call, client, records, project, location, PIPELINES,
                                         pipelines.recorded(pipeline, backing.name), translation, numeric)
            except BaseException:
                records.delete(backing)
                raise
            assert record.job_key  # queued
            records.set_job_key(backing, record.job_key)
            return pipelines.training_pipeline(record, job)

    def upload_model(self, call: Call, project: str, location: str) -> dict:
        raise ApiError(404, "Models are not created directly here: a trainingPipeline with a modelToUpload "
                       "uploads its Model when its job succeeds (models.upload is not served).")

    def upload_models(self, client: Client, records: VertexRecords, project: str) -> None:
        """Upload the Model of each of the project's pipelines whose job succeeded since the last
        read: what the service did when the job ended, done by the first read after it."""
        for record in records.list(project, PIPELINES):
            if not pipelines.awaits_upload(record):
                continue
            job = _job_of(client, record)
            if job is not None and job.state is State.SUCCEEDED:
                self._upload_model(records, record, job)

    def _upload_model(self, records: VertexRecords, pipeline: Record, job: Job) -> None:
        output_dir = pipelines.output_dir_of(pipeline)
        if self._holds_no_files(pipelines.artifact_uri(output_dir)):
            records.update_body(pipeline, pipelines.with_upload_error(
                pipeline, pipelines.FAILED_PRECONDITION, pipelines.no_artifacts_message(output_dir)))
            return
        model_id = pipelines.model_id_of(pipeline)
        at = rfc3339(job.end_time or utc_now())
        model = pipelines.uploaded_model(pipeline, model_id, output_dir, at)
        existing = records.get(pipeline.project, MODELS, model_id)
        if existing is None:
            try:
                existing = records.add(pipeline.project, MODELS, pipeline.location, model, numeric_id=model_id)
            except Exception:  # another reader uploaded it first (the store's unique key)
                existing = records.get(pipeline.project, MODELS, model_id)
                if existing is None:
                    raise
        if existing.body.get("trainingPipeline") != pipeline.name:  # the modelId was taken meanwhile
            records.update_body(pipeline, pipelines.with_upload_error(
                pipeline, pipelines.ALREADY_EXISTS, f"Model [{existing.name}] already exists."))
            return
        records.update_body(pipeline, pipelines.with_upload(pipeline, existing.name))
        log.info("uploaded %s from %s", existing.name, pipeline.name)

    def _holds_no_files(self, uri: str) -> bool:
        """Whether a gs:// directory kept on this machine holds no file (False for Cloud Storage
        itself, which this server does not list)."""
        root, _ = gcs_root_for(self.settings.gcs_mode, self.settings.gcs_root)
        if root is None:
            return False
        try:
            directory = local_gcs_path(root, uri)
        except ValidationError:
            return True
        return not directory.is_dir() or not any(path.is_file() for path in directory.rglob("*"))

    def queue(self, call: Call, client: Client, records: VertexRecords, project: str, location: str, kind: str,
              body: dict, translation: Translation, numeric: str) -> tuple[Record, Job]:
        """Queue the ml v1 job of a translated resource and record the resource: the record first,
        so that the job is never seen without it; removed again when the job is refused."""
        job = translation.job
        self._ml_jobs.check_host_paths(call, job)
        submission = client.prepare(SubmitFlags(job_id=job.job_id, project=project), base=job)
        submission = dataclasses.replace(submission, shared_buckets=call.access.shared_with(project),
                                         contract=translation.contract, rules=translation.rules,
                                         log_notices=translation.notices)
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
            numeric, _, version = numeric.partition("@")
            with self._client(project) as (client, records):
                self._refresh(kind, client, records, project)
                record = _find(records, project, location, kind, numeric)
                resource = render(record, _job_of(client, record))
            if version and version not in (resource.get("versionId"), *resource.get("versionAliases", ())):
                raise ApiError(404, f"The {SINGULAR.get(kind, kind)} does not exist: {record.name}@{version}.")
            return resource
        return get

    def list(self, kind: str, render: Callable[[Record, Job | None], dict]) -> Callable[..., dict]:
        def list_(call: Call, project: str, location: str) -> dict:
            call.accept("filter", "pageSize", "pageToken", "readMask")
            call.authorize(project, write=False)
            page_size = call.int_param("pageSize", LIST_PAGE_SIZE, LIST_MOST)
            start = _decode_token(call.params.get("pageToken") or "")
            expr = _vertex_filter(call.params.get("filter") or "")
            with self._client(project) as (client, records):
                self._refresh(kind, client, records, project)
                if expr is None:  # the store pages: only the page (and one more, to know of a next) is read
                    chosen = records.list(project, kind, _location(location), start, page_size + 1)
                    found = _rendered(client, chosen, render)
                    offset = 0
                else:
                    offset = start
                    everything = _rendered(client, records.list(project, kind, _location(location)), render)
                    found = [item for item in everything if filtering.evaluate(expr, item)]
            page = found[offset:offset + page_size]
            answer: dict[str, Any] = {kind: page} if page else {}
            if offset + page_size < len(found):
                answer["nextPageToken"] = _encode_token(start + page_size)
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
                # The job's own ID: a pipeline's backing CustomJob runs on the pipeline's job.
                client.cancel(job.job_id, timeout=0)  # answered at once; the job ends CANCELLED soon
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
                if record.job_key and job is not None and not _shares_its_job(records, record):
                    job_files.forget(record.job_key, self.settings, client.store)
                records.delete(record)
                return self._done_operation(records, project, record.location, record.name)
        return delete

    def _refresh(self, kind: str, client: Client, records: VertexRecords, project: str) -> None:
        refresh = self.kinds[kind].refresh
        if refresh is not None:
            refresh(client, records, project)

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


def log_source(client: Client, project: str, job_id: str) -> LogSource | None:
    """A Vertex AI job's log, by its numeric ID, in Vertex's words (Cloud Logging's entries.list)."""
    found = vertex_logs.find(client.store, project, job_id)
    return LogSource(found.job_key, found.task_name, found.message) if found else None


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


def _shares_its_job(records: VertexRecords, record: Record) -> bool:
    """Whether another resource runs on the record's job (a pipeline and its backing CustomJob):
    the job is kept until the last of them is deleted."""
    assert record.job_key
    return any(records.of_job(record.job_key, kind) is not None
               for kind in (CUSTOM_JOBS, TUNING_JOBS, PIPELINES) if kind != record.kind)


def _rendered(client: Client, chosen: list[Record], render: Callable[[Record, Job | None], dict]) -> list[dict]:
    """The records as resources, their jobs read in one query."""
    jobs = client.store.get_many([record.job_key for record in chosen if record.job_key])
    return [render(record, jobs.get(record.job_key) if record.job_key else _job_of(client, record))
            for record in chosen]


def _job_of(client: Client, record: Record) -> Job | None:
    """The ml v1 job that runs the record; found by its ID in the record's project when the
    record does not name it yet (a create still under way, or one whose server stopped between
    queueing the job and naming it in the record)."""
    key = record.job_key
    if key is None and record.kind in JOB_PREFIX:  # Models and operations run no job
        key = client.store.key_of(record.project, record.job_id)
    return client.store.get(key) if key else None


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



"""Vertex AI's resources in the job store: each created resource's numeric ID, location and
the body its client gave, beside the ml v1 job that runs it (its key). The job holds the state,
times, trials and logs; the record holds what only Vertex's resource has (displayName, the
job spec as given). One table, `vertex_resources` (aiptrain.jobtable makes it)."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from aiptrain.jobtable import JobTable
from aiptrain.model import rfc3339, utc_now

CUSTOM_JOBS, TUNING_JOBS, PIPELINES = "customJobs", "hyperparameterTuningJobs", "trainingPipelines"
MODELS, OPERATIONS = "models", "operations"
# The ml v1 job that runs a resource is named by its kind and numeric ID (a job ID starts with a letter).
JOB_PREFIX = {CUSTOM_JOBS: "custom_job_", TUNING_JOBS: "hp_tuning_job_", PIPELINES: "training_pipeline_"}


@dataclass(frozen=True)
class Record:
    project: str
    kind: str
    id: str
    location: str
    create_time: str
    body: dict[str, Any]
    job_key: str | None = None

    @property
    def name(self) -> str:
        return resource_name(self.project, self.location, self.kind, self.id)

    @property
    def job_id(self) -> str:
        """The ID of the ml v1 job that runs it, in its project."""
        return JOB_PREFIX[self.kind] + self.id


def resource_name(project: str, location: str, kind: str, numeric_id: str) -> str:
    return f"projects/{project}/locations/{location}/{kind}/{numeric_id}"


def new_id() -> str:
    """A server-assigned ID as the service gives them: a number of 19 digits."""
    return str(10**18 + secrets.randbelow(9 * 10**18))


class VertexRecords:
    def __init__(self, store: JobTable):
        self._store = store

    def add(self, project: str, kind: str, location: str, body: dict[str, Any], job_key: str | None = None,
            numeric_id: str | None = None) -> Record:
        record = Record(project, kind, numeric_id or new_id(), location, rfc3339(utc_now()), body, job_key)
        with self._store.write_transaction():
            self._store.execute(
                "INSERT INTO vertex_resources (project, kind, id, location, job_key, create_time, body) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (project, kind, record.id, location, job_key, record.create_time, json.dumps(body)),
            )
        return record

    def set_job_key(self, record: Record, job_key: str) -> Record:
        with self._store.write_transaction():
            self._store.execute("UPDATE vertex_resources SET job_key = ? WHERE project = ? AND kind = ? AND id = ?",
                                (job_key, record.project, record.kind, record.id))
        return Record(**{**record.__dict__, "job_key": job_key})

    def update_body(self, record: Record, body: dict[str, Any]) -> Record:
        with self._store.write_transaction():
            self._store.execute("UPDATE vertex_resources SET body = ? WHERE project = ? AND kind = ? AND id = ?",
                                (json.dumps(body), record.project, record.kind, record.id))
        return Record(**{**record.__dict__, "body": body})

    def get(self, project: str, kind: str, numeric_id: str) -> Record | None:
        row = self._store.execute(
            f"SELECT {_FIELDS} FROM vertex_resources WHERE project = ? AND kind = ? AND id = ?",
            (project, kind, numeric_id)).fetchone()
        return _record(row) if row else None

    def of_job(self, job_key: str, kind: str | None = None) -> Record | None:
        """The resource a job runs (a pipeline's backing custom job: kind customJobs)."""
        rows = self._store.execute(f"SELECT {_FIELDS} FROM vertex_resources WHERE job_key = ?", (job_key,)).fetchall()
        found = [_record(row) for row in rows if kind is None or row[1] == kind]
        return found[0] if found else None

    def list(self, project: str, kind: str, location: str | None = None, offset: int = 0,
             limit: int | None = None) -> list[Record]:
        """The project's resources of a kind (in `location`, else in all), newest first; from
        `offset`, at most `limit`."""
        where, params = "project = ? AND kind = ?", [project, kind]
        if location is not None:
            where, params = where + " AND location = ?", [*params, location]
        page = " LIMIT ? OFFSET ?" if limit is not None else ""
        rows = self._store.execute(
            f"SELECT {_FIELDS} FROM vertex_resources WHERE {where} ORDER BY create_time DESC, id DESC{page}",
            (*params, *([limit, offset] if limit is not None else []))).fetchall()
        return [_record(row) for row in rows]

    def delete(self, record: Record) -> None:
        with self._store.write_transaction():
            self._store.execute("DELETE FROM vertex_resources WHERE project = ? AND kind = ? AND id = ?",
                                (record.project, record.kind, record.id))


_FIELDS = "project, kind, id, location, create_time, body, job_key"


def _record(row: tuple) -> Record:
    project, kind, numeric_id, location, create_time, body, job_key = row
    return Record(project, kind, numeric_id, location, create_time, json.loads(body), job_key)

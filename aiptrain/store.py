"""The job store: one SQLite database, the record of every job and its state changes.

aiptrain.jobtable holds the schema and the untyped reads; this module adds the `Job` API.
SQLite in WAL mode with a busy timeout lets many CLI processes and supervisors read and
write at once; state changes are compare-and-set inside `BEGIN IMMEDIATE`, so two processes
never both move a job out of the same state, and a committed change survives a crash of
the writer.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from typing import Iterable

from aiptrain.errors import ValidationError
from aiptrain.jobtable import JobTable, labels_column
from aiptrain.model import Job, State, TrainingOutput, rfc3339, utc_now


class JobStore(JobTable):
    def _event(self, job_id: str, moment: datetime, state: State, detail: str | None) -> None:
        self._db.execute(
            "INSERT INTO events (job_id, time, state, detail) VALUES (?, ?, ?, ?)",
            (job_id, rfc3339(moment), state.value, detail),
        )

    def create(self, job: Job, backend: str = "docker") -> Job:
        """Record a new job in QUEUED, run by `backend`. A job ID that exists already is a
        ValidationError."""
        job = job.model_copy(update={"state": State.QUEUED, "create_time": job.create_time or utc_now()})
        try:
            with self._transaction():
                resource = job.to_resource()
                self._db.execute(
                    "INSERT INTO jobs (job_id, state, create_time, resource, labels, backend) VALUES (?, ?, ?, ?, ?, ?)",
                    (job.job_id, job.state.value, rfc3339(job.create_time), json.dumps(resource),
                     labels_column(resource), backend),
                )
                self._event(job.job_id, job.create_time, State.QUEUED, None)
        except sqlite3.IntegrityError:
            raise duplicate_job(job.job_id) from None
        return job

    def get(self, job_id: str) -> Job | None:
        row = self._db.execute("SELECT resource FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return Job.model_validate_json(row[0]) if row else None

    def list(self) -> list[Job]:
        rows = self._db.execute("SELECT resource FROM jobs ORDER BY create_time DESC, job_id").fetchall()
        return [Job.model_validate_json(resource) for (resource,) in rows]

    def update_labels(self, job_id: str, change) -> tuple[Job | None, bool]:
        """Replace the job's labels with `change(labels)` in one compare-and-set; (the job, whether
        its labels changed). The state and everything else are left as they are."""
        with self._transaction():
            row = self._db.execute("SELECT resource FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                return None, False
            job = Job.model_validate_json(row[0])
            labels = change(dict(job.labels or {}))
            if labels == (job.labels or {}):
                return job, False
            job = job.model_copy(update={"labels": labels or None})
            resource = job.to_resource()
            # Read and written under one write lock: no transition in between can be undone.
            self._db.execute("UPDATE jobs SET resource = ?, labels = ? WHERE job_id = ?",
                             (json.dumps(resource), labels_column(resource), job_id))
        return job, True

    def delete(self, job_id: str) -> None:
        """Forget a job entirely: only for a submission that was rejected before it started."""
        with self._transaction():
            self._db.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
            self._db.execute("DELETE FROM events WHERE job_id = ?", (job_id,))
            self._db.execute("DELETE FROM verdicts WHERE job_id = ?", (job_id,))

    def update_resource(self, job: Job) -> None:
        """Replace the stored resource (e.g. packageUris after staging), keeping the state."""
        resource = job.to_resource()
        with self._transaction():
            self._db.execute(
                "UPDATE jobs SET resource = json_set(?, '$.state', state), labels = ? WHERE job_id = ?",
                (json.dumps(resource), labels_column(resource), job.job_id),
            )

    def set_training_output(self, job_id: str, output: TrainingOutput) -> None:
        """Replace trainingOutput only: state, errorMessage and the rest stay as they are, so
        this never undoes a concurrent transition (a cancel, say)."""
        with self._transaction():
            self._db.execute(
                "UPDATE jobs SET resource = json_set(resource, '$.trainingOutput', json(?)) WHERE job_id = ?",
                (json.dumps(output.to_resource()), job_id),
            )

    def record_verdict(self, job_id: str, verdict: dict) -> None:
        """Keep a supervisor's decision before it tears the job down: one that dies meanwhile is
        followed by one that finishes the same ending instead of judging the remains."""
        with self._transaction():
            self._db.execute("INSERT OR REPLACE INTO verdicts (job_id, verdict) VALUES (?, ?)",
                             (job_id, json.dumps(verdict)))

    def verdict(self, job_id: str) -> dict | None:
        row = self._db.execute("SELECT verdict FROM verdicts WHERE job_id = ?", (job_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def transition(
        self,
        job_id: str,
        to_state: State,
        from_states: Iterable[State],
        error_message: str | None = None,
        detail: str | None = None,
    ) -> Job | None:
        """Move a job to `to_state` if it is in one of `from_states`; return it, or None if it was not.

        Entering RUNNING sets startTime, a terminal state sets endTime.
        """
        allowed = {s.value for s in from_states}
        with self._transaction():
            row = self._db.execute("SELECT state, resource FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None or row[0] not in allowed:
                return None
            job = Job.model_validate_json(row[1])
            now = utc_now()
            update: dict = {"state": to_state}
            if to_state is State.RUNNING and job.start_time is None:
                update["start_time"] = now
            if to_state.is_terminal:
                update["end_time"] = now
            if error_message is not None:
                update["error_message"] = error_message
            job = job.model_copy(update=update)
            self._db.execute(
                "UPDATE jobs SET state = ?, resource = ? WHERE job_id = ?",
                (to_state.value, json.dumps(job.to_resource()), job_id),
            )
            self._event(job_id, now, to_state, detail or error_message)
        return job

    def events(self, job_id: str) -> list[tuple[str, str, str | None]]:
        return self._db.execute(
            "SELECT time, state, detail FROM events WHERE job_id = ? ORDER BY rowid", (job_id,)
        ).fetchall()

    def restarts(self, job_id: str) -> dict[str, int]:
        row = self._db.execute("SELECT restarts FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return json.loads(row[0]) if row else {}

    def count_restart(self, job_id: str, task_name: str) -> int:
        """Add one restart of `task_name`; return its new count."""
        with self._transaction():
            counts = self.restarts(job_id)
            counts[task_name] = counts.get(task_name, 0) + 1
            self._db.execute("UPDATE jobs SET restarts = ? WHERE job_id = ?", (json.dumps(counts), job_id))
        return counts[task_name]


def duplicate_job(job_id: str) -> ValidationError:
    return ValidationError(
        f"Job [{job_id}] already exists: job IDs stay taken after a job ends, so choose a new ID."
    )

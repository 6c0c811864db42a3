"""The job store: one database (the home's SQLite file, or PostgreSQL), the record of every job
and its state changes.

aiptrain.jobtable holds the schema and the untyped reads; this module adds the `Job` API.
Many CLI processes and the controller read and write at once; state changes are compare-and-set
inside the store's write transaction (aiptrain.dialects: SQLite's `BEGIN IMMEDIATE`, PostgreSQL's
advisory lock), so two processes never both move a job out of the same state, and a committed
change survives a crash of the writer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime

from aiptrain.admission import Queued, Verdict
from aiptrain.errors import JobExists, JobNotFound
from aiptrain.jobkeys import JobKey, new_key
from aiptrain.jobtable import DamagedRecord, JobTable, labels_column
from aiptrain.model import Job, State, TrainingOutput, rfc3339, utc_now


class JobStore(JobTable):
    """The jobs by key (aiptrain.jobkeys): every method but `create`, `new_key` and the lookups
    by project (`key_of`, `job_ids`, `resources`) takes the job's key, which the façades find
    from (project, job ID) first."""

    def _event(self, job_id: str, moment: datetime, state: State, detail: str | None) -> None:
        self._db.execute(
            "INSERT INTO events (job_id, time, state, detail) VALUES (?, ?, ?, ?)",
            (job_id, rfc3339(moment), state.value, detail),
        )

    def new_key(self, project: str, job_id: str) -> JobKey:
        """The key a new job `job_id` of `project` gets (aiptrain.jobkeys.new_key)."""
        return new_key(project, job_id, self.default_project, plain_taken=self.exists(job_id))

    def create(self, job: Job, backend: str = "docker", project: str | None = None,
               key: JobKey | None = None) -> Job:
        """Record a new job of `project` (default: the store's default project) in QUEUED, run by
        `backend`, under `key` (default: `new_key`). A job ID the project has already, or a key
        taken meanwhile, is a JobExists (409)."""
        project = project or self.default_project
        created = job.create_time or utc_now()
        job = job.model_copy(update={"state": State.QUEUED, "create_time": created})
        try:
            with self._transaction():
                key = key or self.new_key(project, job.job_id)
                resource = job.to_resource()
                self._db.execute(
                    "INSERT INTO jobs (job_id, project, name, state, create_time, resource, labels, backend) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (key, project, job.job_id, State.QUEUED.value, rfc3339(created), json.dumps(resource),
                     labels_column(resource), backend),
                )
                self._event(key, created, State.QUEUED, None)
        except self._db.integrity_errors:
            raise duplicate_job(job.job_id) from None
        return job

    def get(self, job_id: str) -> Job | None:
        """The job, None if there is none; DamagedRecord (exit 3) if its row cannot be read."""
        row = self._db.execute("SELECT resource FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return self._parsed(job_id, row[0]) if row else None

    def get_many(self, keys: list[str]) -> dict[str, Job]:
        """The jobs of these keys that exist, in one query (a page of a list); DamagedRecord as get."""
        if not keys:
            return {}
        rows = self._db.execute(f"SELECT job_id, resource FROM jobs WHERE job_id IN ({','.join('?' * len(keys))})",
                                tuple(keys)).fetchall()
        return {key: self._parsed(key, resource) for key, resource in rows}

    def require(self, job_id: str) -> Job:
        """The job, which must exist (JobNotFound otherwise): for whoever drives or submitted it."""
        job = self.get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    def all(self) -> list[Job]:
        """Every job, newest first; a damaged row is reported once and left out."""
        rows = self._db.execute("SELECT job_id, resource FROM jobs ORDER BY create_time DESC, job_id").fetchall()
        jobs = []
        for job_id, resource in rows:
            try:
                jobs.append(self._parsed(job_id, resource))
            except DamagedRecord as exc:
                self.skip_damaged(job_id, exc.problem)
        return jobs

    def _parsed(self, job_id: str, resource) -> Job:
        try:
            return Job.model_validate_json(resource)
        except ValueError as exc:  # pydantic's ValidationError included
            errors = getattr(exc, "errors", None)
            problem = errors()[0]["msg"] if callable(errors) and errors() else str(exc).splitlines()[0]
            raise DamagedRecord(job_id, self.path, problem) from None

    def update_labels(self, job_id: str, change) -> tuple[Job | None, bool]:
        """Replace the job's labels with `change(labels)` in one compare-and-set; (the job, whether
        its labels changed). The state and everything else are left as they are."""
        with self._transaction():
            row = self._db.execute("SELECT resource FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                return None, False
            job = self._parsed(job_id, row[0])
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
            self._db.execute("DELETE FROM admission WHERE job_id = ?", (job_id,))

    def update_resource(self, key: str, job: Job) -> None:
        """Replace the stored resource of the job `key` (e.g. packageUris after staging), keeping the state."""
        resource = job.to_resource()
        with self._transaction():  # the stored state, read and kept under the write lock
            row = self._db.execute("SELECT state FROM jobs WHERE job_id = ?", (key,)).fetchone()
            if row is None:
                return
            resource["state"] = row[0]
            self._db.execute("UPDATE jobs SET resource = ?, labels = ? WHERE job_id = ?",
                             (json.dumps(resource), labels_column(resource), key))

    def set_training_output(self, job_id: str, output: TrainingOutput) -> None:
        """Replace trainingOutput only: state, errorMessage and the rest stay as they are, so
        this never undoes a concurrent transition (a cancel, say)."""
        with self._transaction():
            row = self._db.execute("SELECT resource FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                return
            resource = _json_object(job_id, self.path, row[0])
            resource["trainingOutput"] = output.to_resource()
            self._db.execute("UPDATE jobs SET resource = ? WHERE job_id = ?", (json.dumps(resource), job_id))

    def record_verdict(self, job_id: str, verdict: dict) -> None:
        """Keep a supervisor's decision before it tears the job down: one that dies meanwhile is
        followed by one that finishes the same ending instead of judging the remains."""
        with self._transaction():
            self._db.execute("INSERT INTO verdicts (job_id, verdict) VALUES (?, ?) "
                             "ON CONFLICT (job_id) DO UPDATE SET verdict = excluded.verdict",
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
        with self._transaction():
            return self._transition(job_id, to_state, from_states, error_message, detail)

    def _transition(self, job_id: str, to_state: State, from_states: Iterable[State],
                    error_message: str | None = None, detail: str | None = None) -> Job | None:
        """`transition`, inside the caller's transaction. A job that ends gives back its capacity."""
        allowed = {s.value for s in from_states}
        row = self._db.execute("SELECT state, resource FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if row is None or row[0] not in allowed:
            return None
        job = self._parsed(job_id, row[1])
        now = utc_now()
        update: dict = {"state": to_state}
        if to_state is State.RUNNING and job.start_time is None:
            update["start_time"] = now
        if to_state.is_terminal:
            update["end_time"] = now
            self._db.execute("DELETE FROM admission WHERE job_id = ?", (job_id,))
        if error_message is not None:
            update["error_message"] = error_message
        job = job.model_copy(update=update)
        self._db.execute(
            "UPDATE jobs SET state = ?, resource = ? WHERE job_id = ?",
            (to_state.value, json.dumps(job.to_resource()), job_id),
        )
        self._event(job_id, now, to_state, detail or error_message)
        return job

    # -- admission (aiptrain.admission decides; the store keeps the queue) ---------------------

    def admission_queue(self) -> tuple[list[Queued], int]:
        """(the jobs waiting to start, oldest first; the replicas admitted jobs hold)."""
        rows = self._db.execute("SELECT job_id, replicas, admitted FROM admission ORDER BY seq").fetchall()
        return [Queued(job_id, replicas) for job_id, replicas, admitted in rows if not admitted], sum(
            replicas for _, replicas, admitted in rows if admitted
        )

    def admission_job_ids(self) -> list[str]:
        """Jobs holding capacity, then those waiting to start, oldest first."""
        return [job_id for (job_id,) in self._db.execute("SELECT job_id FROM admission ORDER BY admitted DESC, seq")]

    def is_enqueued(self, job_id: str) -> bool:
        """Whether the job asked to start (and waits, or was admitted)."""
        return self._db.execute("SELECT 1 FROM admission WHERE job_id = ?", (job_id,)).fetchone() is not None

    def held_replicas(self, job_id: str) -> int | None:
        """The replicas the job holds once admitted (what admission counted for it); None when
        it is not queued."""
        row = self._db.execute("SELECT replicas FROM admission WHERE job_id = ?", (job_id,)).fetchone()
        return row[0] if row else None

    def queue_position(self, job_id: str) -> tuple[int, str | None] | None:
        """(1 for the next job to start, why it waits) for a job waiting to start; None otherwise."""
        row = self._db.execute(
            "SELECT seq, reason FROM admission WHERE job_id = ? AND admitted = 0", (job_id,)
        ).fetchone()
        if row is None:
            return None
        ahead = self._db.execute("SELECT COUNT(*) FROM admission WHERE admitted = 0 AND seq < ?", (row[0],))
        return ahead.fetchone()[0] + 1, row[1]

    def request_admission(self, job_id: str, replicas: int, rule: Callable[[list[Queued], int], Verdict]) -> Verdict:
        """Queue the job (once) and apply `rule(queue, used)` to it, all under the store's write
        lock, so two jobs never both take the last capacity. Admitted: the job is PREPARING. A job
        no longer QUEUED (cancelled meanwhile) is not admitted."""
        with self._transaction():
            self._db.execute("INSERT INTO admission (job_id, replicas) VALUES (?, ?) ON CONFLICT (job_id) DO NOTHING",
                             (job_id, replicas))
            queue, used = self.admission_queue()
            verdict = rule(queue, used)
            if verdict.admitted:
                if self._transition(job_id, State.PREPARING, [State.QUEUED]) is None:
                    return Verdict(False, 0, "The job is no longer queued.")
                self._db.execute("UPDATE admission SET admitted = 1, reason = NULL WHERE job_id = ?", (job_id,))
            else:
                self._db.execute("UPDATE admission SET reason = ? WHERE job_id = ?", (verdict.reason, job_id))
        return verdict

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


def _json_object(job_id: str, path, text: str) -> dict:
    try:
        resource = json.loads(text)
    except ValueError as exc:
        raise DamagedRecord(job_id, path, f"not JSON: {exc}") from None
    if not isinstance(resource, dict):
        raise DamagedRecord(job_id, path, "not a JSON object")
    return resource


def duplicate_job(job_id: str) -> JobExists:
    return JobExists(
        f"Job [{job_id}] already exists: job IDs stay taken after a job ends, so choose a new ID."
    )

"""The job store's database without the pydantic model: the schema, its migrations, and
the reads `jobs list` needs, which hand back REST resources as plain dicts.

Only this module knows the schema; aiptrain.store adds the typed `Job` API on top. It stays free
of aiptrain.model so that listing thousands of jobs neither imports pydantic nor parses each
resource into a model. The database is SQLite (the home's jobs.db) or PostgreSQL (AIPTRAIN_STORE);
the SQL here is written once, and aiptrain.dialects says where the two differ.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Self

from aiptrain import dialects
from aiptrain.dialects import StoreUnusable
from aiptrain.errors import EnvironmentNotReady
from aiptrain.filtering import COLUMNS, Condition, Query, listed_only
from aiptrain.jobkeys import DEFAULT_PROJECT, JobKey
from aiptrain.states import NOT_TERMINAL_NAMES

if TYPE_CHECKING:
    from aiptrain.settings import Settings

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id      TEXT PRIMARY KEY,           -- the job's key in the installation (aiptrain.jobkeys)
    state       TEXT NOT NULL,
    create_time TEXT NOT NULL,
    resource    TEXT NOT NULL,              -- the Job resource, camelCase JSON
    restarts    TEXT NOT NULL DEFAULT '{}', -- task name -> restarts so far
    labels      TEXT,                       -- the resource's labels (JSON), or NULL
    backend     TEXT,                       -- what runs its replicas (aiptrain.backends), NULL for docker
    project     TEXT,                       -- the project it was created in
    name        TEXT                        -- its job ID in that project (the resource's jobId)
);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL,
    time   TEXT NOT NULL,
    state  TEXT NOT NULL,
    detail TEXT
);
CREATE INDEX IF NOT EXISTS events_by_job ON events (job_id);
"""
# Added later: `IF NOT EXISTS` makes them a migration that databases made before them take on open.
INDEXES = """
CREATE INDEX IF NOT EXISTS jobs_by_create_time ON jobs (create_time);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, create_time);
CREATE TABLE IF NOT EXISTS verdicts (
    job_id  TEXT PRIMARY KEY,
    verdict TEXT NOT NULL  -- how a supervisor decided the job ends, recorded before it tears down
);
CREATE TABLE IF NOT EXISTS admission (      -- jobs waiting to start or holding capacity (aiptrain.admission)
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,  -- the order jobs asked to start in
    job_id   TEXT NOT NULL UNIQUE,
    replicas INTEGER NOT NULL,                   -- what the job holds once admitted
    admitted INTEGER NOT NULL DEFAULT 0,
    reason   TEXT                                -- why it waits, as describe shows it
);
CREATE TABLE IF NOT EXISTS vertex_resources (  -- Vertex AI's resources (aiptrain.vertex.records)
    project     TEXT NOT NULL,
    kind        TEXT NOT NULL,  -- customJobs, hyperparameterTuningJobs, trainingPipelines, models, operations
    id          TEXT NOT NULL,  -- the numeric ID the server gave it
    location    TEXT NOT NULL,
    job_key     TEXT,           -- the job that runs it (aiptrain.jobkeys), or NULL
    create_time TEXT NOT NULL,
    body        TEXT NOT NULL,  -- what the client gave, camelCase JSON, as normalized at create
    PRIMARY KEY (project, kind, id)
);
"""
# Columns added after the first release: name -> the resource's member that fills it in, or None
# for the value every earlier job had (their backend was docker, the only one then). `project` and
# `name` came with job IDs per project (see _add_project_columns).
ADDED_COLUMNS = {"labels": "labels", "backend": None, "project": None, "name": None}
_ADDED_DEFAULT = "docker"
# One job per (project, ID): made once the columns are there.
PROJECT_INDEX = "jobs_by_project"
# Where releases before job IDs were per project kept a job's --project: beside its log.
LEGACY_PROJECT_SUFFIX = ".project"
# The columns `jobs list` prints from without reading the resource, by the resource's key.
LISTED = {**COLUMNS, "labels": "labels"}
# The states that are not terminal, named rather than "not terminal" so the state index finds them.
ACTIVE = NOT_TERMINAL_NAMES
# The labels column is a copy of the resource's labels, written again by any change of them.
LABELS_REWRITTEN = "an `aiptrain jobs update` that changes its labels writes the column again"
_SQL_OPERATORS = {"<": "<", "<=": "<=", ">": ">", ">=": ">="}


class DamagedRecord(EnvironmentNotReady):
    """One job's row in the store cannot be read; the other jobs can."""

    def __init__(self, job_id: str, path: Path | str, problem: str):
        self.job_id, self.problem = job_id, problem
        where = dialects.shown_url(str(path)) if dialects.is_postgres_url(path) else path
        forget = (f"psql '{where}' -c" if dialects.is_postgres_url(path) else f"sqlite3 {path}")
        super().__init__(
            f"The record of job [{job_id}] in the job store [{where}] is damaged ({problem}); the other jobs are "
            f"unaffected: restore the store from a backup, or forget the job with "
            f"`{forget} \"DELETE FROM jobs WHERE job_id = '{job_id}'\"`."
        )


def store_problem(path: Path | str, exc: Exception) -> StoreUnusable:
    """One line naming the store (a file, or a PostgreSQL URL without its password), what is
    wrong with it and what to do."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if dialects.is_postgres_url(path):
        return _postgres_problem(str(path), text)
    if isinstance(exc, sqlite3.OperationalError) and "locked" in text:
        fix = "another aiptrain process holds it too long; try again"
    elif isinstance(exc, sqlite3.OperationalError) and ("full" in text or "disk" in text):
        fix = "free space on its disk, then try again"
    elif isinstance(exc, (sqlite3.OperationalError, OSError)):
        fix = "check that the file and its directory exist and are readable and writable (AIPTRAIN_HOME)"
    else:  # "file is not a database", "database disk image is malformed"
        fix = (f"move it aside (`mv {path} {path}.damaged`) to start with an empty store, or restore it "
               "from a backup")
    return StoreUnusable(f"The job store [{path}] cannot be used ({text}): {fix}.")


def _postgres_problem(url: str, text: str) -> StoreUnusable:
    for secret in dialects.passwords_in(url):  # servers do not echo it; a driver's parse error might
        text = text.replace(secret, "***")
    return StoreUnusable(
        f"The job store [{dialects.shown_url(url)}] cannot be used ({text.strip()}): check that the PostgreSQL "
        "server runs and accepts connections there, and that AIPTRAIN_STORE names its user, password and database "
        "(or unset AIPTRAIN_STORE for the SQLite store in AIPTRAIN_HOME)."
    )


def warn_on_stderr(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr, flush=True)


class JobTable:
    def __init__(self, path: Path | str, warn: Callable[[str], None] = warn_on_stderr,
                 default_project: str = DEFAULT_PROJECT, legacy_logs: Path | None = None):
        """`path`: the SQLite file, or a postgresql:// URL (Settings.store gives the one configured;
        messages name it without its password). `default_project`: the installation's (a job
        created without a project is in it; its jobs keep their ID as key: aiptrain.jobkeys);
        `legacy_logs`: where an older store's jobs kept their project (read once, when the
        store gains its project column). `JobTable.of(settings)` passes all three."""
        self.path = path
        self._warn = warn
        self.default_project = default_project
        self._legacy_logs = legacy_logs
        self._warned: set[str] = set()  # jobs whose damaged record was reported already
        db = None
        try:
            db = self._db = dialects.connect(path)
            self._ensure_schema()
        except StoreUnusable:
            raise
        except Exception as exc:  # noqa: BLE001 - only the database's own errors and OSError are expected
            if db is not None:
                db.close()
            if not is_database_error(exc):
                raise
            raise store_problem(path, exc) from None

    @classmethod
    def of(cls, settings: Settings) -> Self:
        """The settings' store, with the installation's default project."""
        return cls(settings.store, default_project=settings.default_project, legacy_logs=settings.logs_dir)

    def skip_damaged(self, job_id: str, problem: str,
                     consequence: str = "it is left out; `aiptrain jobs describe` on it says what to do") -> None:
        """Say once, in one line, that a job's record is damaged, and what that does here."""
        if job_id not in self._warned:
            self._warned.add(job_id)
            self._warn(f"The record of job [{job_id}] in the job store [{self._db.where}] is damaged ({problem}): "
                       f"{consequence}.")

    def _ensure_schema(self) -> None:
        """The tables and the added columns, set up once per database. Every CLI process opens
        the store, many at once: only the first must write, and it does so inside the store's
        write transaction, which waits for the write lock (an autocommit CREATE that reads the
        schema, then finds another process changed it, fails at once with "database is locked")."""
        if not self._schema_is_current():
            with self._transaction():
                for statement in filter(str.strip, (SCHEMA + INDEXES).split(";")):
                    self._db.execute(self._db.ddl(statement))
                for statement in self._db.extra_schema:
                    self._db.execute(statement)
                self._add_columns()
                self._db.execute(f"CREATE UNIQUE INDEX IF NOT EXISTS {PROJECT_INDEX} ON jobs (project, name)")

    def _schema_is_current(self) -> bool:
        names = self._db.schema_names()
        return ({"jobs", "events", "verdicts", "jobs_by_state", "admission", "vertex_resources", PROJECT_INDEX} <= names
                and not self._missing_columns())

    def _missing_columns(self) -> list[str]:
        present = self._db.columns("jobs")
        return [name for name in ADDED_COLUMNS if name not in present]

    def _add_columns(self) -> None:
        """Columns a database made before them lacks, filled in from each stored resource (under
        the write lock the caller holds, so no row is written meanwhile)."""
        missing = self._missing_columns()
        for name in missing:
            self._db.execute(self._db.ddl(f"ALTER TABLE jobs ADD COLUMN {name} TEXT"))
            member = ADDED_COLUMNS[name]
            if name in ("project", "name"):
                continue
            if member is None:
                self._db.execute(f"UPDATE jobs SET {name} = ?", (_ADDED_DEFAULT,))
            else:
                self._db.execute(f"UPDATE jobs SET {name} = {self._db.json_member('resource')}",
                                 (self._db.member_path(member),))

        if "project" in missing or "name" in missing:
            self._add_project_columns()

    def _add_project_columns(self) -> None:
        """Job IDs became unique per project: every earlier job keeps its ID as its key and name,
        in the project its submit recorded beside its log (`logs/<job>.project`, given with
        --project or by the API), else in the default project, where such a job was shown."""
        self._db.execute("UPDATE jobs SET name = job_id, project = ?", (self.default_project,))
        if self._legacy_logs is None or not self._legacy_logs.is_dir():
            return
        for path in self._legacy_logs.glob(f"*{LEGACY_PROJECT_SUFFIX}"):
            try:
                project = path.read_text().strip()
            except (OSError, UnicodeDecodeError):
                continue  # unreadable: the job stays in the default project, as it was shown
            if project:
                self._db.execute("UPDATE jobs SET project = ? WHERE job_id = ?",
                                 (project, path.name[:-len(LEGACY_PROJECT_SUFFIX)]))

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> JobTable:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _transaction(self):
        """The store's write transaction: no other writer until it commits (aiptrain.dialects)."""
        return self._db.transaction()

    # For the tables of other modules (aiptrain.vertex.records): SQL in SQLite's spelling.
    def execute(self, sql: str, params: tuple = ()):
        return self._db.execute(sql, params)

    def write_transaction(self):
        return self._transaction()

    def exists(self, key: str) -> bool:
        """Whether a job has this key (aiptrain.jobkeys)."""
        return self._db.execute("SELECT 1 FROM jobs WHERE job_id = ?", (key,)).fetchone() is not None

    def key_of(self, project: str, job_id: str) -> JobKey | None:
        """The key of the job `job_id` of `project`; None when the project has no such job."""
        row = self._db.execute("SELECT job_id FROM jobs WHERE project = ? AND name = ?", (project, job_id)).fetchone()
        return JobKey(row[0]) if row else None

    def project_of(self, key: str) -> str:
        """The project the job was created in (the default project for a job the store lacks)."""
        row = self._db.execute("SELECT project FROM jobs WHERE job_id = ?", (key,)).fetchone()
        return (row and row[0]) or self.default_project

    def backend_of(self, job_id: str) -> str:
        """The backend that runs the job (docker for a job the store does not know)."""
        row = self._db.execute("SELECT backend FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return (row and row[0]) or "docker"

    def job_ids(self, project: str, prefix: str = "") -> list[str]:
        """The project's job IDs starting with `prefix` (case-sensitive), newest first."""
        rows = self._db.execute(
            "SELECT name FROM jobs WHERE project = ? AND substr(name, 1, ?) = ? ORDER BY create_time DESC, name",
            (project, len(prefix), prefix),
        ).fetchall()
        return [job_id for (job_id,) in rows]

    def active_job_ids(self) -> list[str]:
        rows = self._db.execute(
            f"SELECT job_id FROM jobs WHERE state IN ({','.join('?' * len(ACTIVE))})", ACTIVE
        ).fetchall()
        return [job_id for (job_id,) in rows]

    def resources(self, query: Query, fields: Iterable[str] | None = None, project: str | None = None) -> list[dict]:
        """The resources of the jobs meeting the query's conditions, in its order (newest first
        by default), at most its limit; only `project`'s jobs when given. `fields`: the only keys
        the caller reads; when the columns hold them all (filtering.listed_only), the resources
        are made of those columns alone, without reading or parsing the stored JSON."""
        where, params = ([], []) if project is None else (["project = ?"], [project])
        for condition in query.conditions:
            clause, values = _sql_condition(self._db, condition)
            where.append(clause)
            params += values
        order = []
        for key in query.order:
            expression, values = _sql_sort_key(self._db, key.key)
            # No label sorts first, as SQLite sorts NULL; PostgreSQL would sort it last. (Columns
            # are never NULL: they keep a plain order, which their indexes serve.)
            nulls = "" if key.key in COLUMNS else (" NULLS LAST" if key.descending else " NULLS FIRST")
            order.append(f"{expression} {'DESC' if key.descending else 'ASC'}{nulls}")
            params += values
        if any(key not in COLUMNS for key in [c.key for c in query.conditions] + [k.key for k in query.order]):
            self._report_damaged_labels()
        keys = _listed_keys(fields)
        sql = f"SELECT job_id, {'resource' if keys is None else ', '.join(LISTED[key] for key in keys)} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY " + ", ".join([*order, "create_time DESC", "name", "job_id"])  # ties: newest first, as unsorted
        skipped = 0  # damaged rows are left out: the limit then reaches as many rows further
        while True:
            limit = [query.limit + skipped] if query.limit else []
            rows = self._db.execute(sql + (" LIMIT ?" if limit else ""), [*params, *limit]).fetchall()
            found = [r for r in (self._row_resource(keys, row) for row in rows) if r is not None]
            if not query.limit:  # None or 0: every row
                return found
            if len(found) >= query.limit or len(rows) < limit[0]:
                return found[:query.limit]
            skipped = len(rows) - len(found)

    def _report_damaged_labels(self) -> None:
        """Jobs whose labels column is damaged: SQL on labels reads them as having none, so say so."""
        rows = self._db.execute(f"SELECT job_id FROM jobs WHERE labels IS NOT NULL AND NOT {self._db.json_valid('labels')}")
        for (job_id,) in rows.fetchall():
            self.skip_damaged(job_id, "its labels column is not JSON", "filters and sorts read it as having no labels; "
                              f"{LABELS_REWRITTEN}")

    def _row_resource(self, keys: tuple[str, ...] | None, row: tuple) -> dict | None:
        """The resource of one row; None (and a warning) when it is damaged."""
        job_id, *values = row
        try:
            if keys is None:
                resource = json.loads(values[0])
                if not isinstance(resource, dict):
                    raise ValueError("not a JSON object")
                return resource
            return _listed_resource(keys, values)
        except (ValueError, TypeError) as exc:
            problem = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if keys is None:
                self.skip_damaged(job_id, problem)
            else:  # the labels column, the only JSON among the columns listed
                self.skip_damaged(job_id, f"its labels column: {problem}", f"it is left out; {LABELS_REWRITTEN}")
            return None


def _listed_keys(fields: Iterable[str] | None) -> tuple[str, ...] | None:
    """The resource keys to read from columns for these fields; None: read whole resources."""
    fields = list(fields or ())
    if not fields or not listed_only(fields):
        return None
    return tuple(key for key in LISTED if any(f == key or f.startswith(f"{key}.") for f in fields))


def _listed_resource(keys: tuple[str, ...], row: Iterable) -> dict:
    resource = {key: value for key, value in zip(keys, row, strict=True) if value is not None}
    if "labels" in resource:
        resource["labels"] = json.loads(resource["labels"])
        if not isinstance(resource["labels"], dict):
            raise ValueError("labels are not a JSON object")
    return resource


def labels_column(resource: dict) -> str | None:
    """What the labels column holds for a resource (kept beside it on every write)."""
    labels = resource.get("labels")
    return None if labels is None else json.dumps(labels)


def _sql_sort_key(sql: dialects.Dialect, key: str) -> tuple[str, list]:
    """The SQL expression of a listed key and its parameters; `sql`: the store's dialect."""
    if key in COLUMNS:
        return COLUMNS[key], []
    # `labels.KEY`: a damaged labels column has no labels, rather than failing the query of every job.
    label = sql.member_path(key.split(".", 1)[1])
    return f"CASE WHEN {sql.json_valid('labels')} THEN {sql.json_member('labels')} END", [label]


def _sql_condition(sql: dialects.Dialect, condition: Condition) -> tuple[str, list]:
    column, params = _sql_sort_key(sql, condition.key)
    value = condition.value
    if condition.op == "IN":
        return f"{column} IN ({','.join('?' * len(value))})", [*params, *value]
    if condition.op == "NOT_IN":  # a missing label is not any of the values
        return f"coalesce({column} NOT IN ({','.join('?' * len(value))}), TRUE)", [*params, *value]
    if condition.op == "PREFIX":
        return f"substr({column}, 1, ?) = ?", [*params, len(value), value]
    if condition.op == "CONTAINS_NOCASE":
        return sql.contains(f"lower({column})"), [*params, value.lower()]
    if condition.op == "PAGE_AFTER":  # (createTime, jobId) after a page's last job, newest first
        create_time, name = value
        return "(create_time < ? OR (create_time = ? AND name > ?))", [create_time, create_time, name]
    return f"{column} {_SQL_OPERATORS[condition.op]} ?", [*params, value]


def is_database_error(exc: BaseException) -> bool:
    """Whether the store's database failed (rather than aiptrain): SQLite's errors, PostgreSQL's
    (psycopg's, looked up only when it was imported), or the file system's."""
    if isinstance(exc, (sqlite3.DatabaseError, OSError)):
        return True
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.Error)

"""The job store's SQLite database without the pydantic model: the schema, its migrations, and
the reads `jobs list` needs, which hand back REST resources as plain dicts.

Only this module knows the schema; aiptrain.store adds the typed `Job` API on top. It stays free
of aiptrain.model so that listing thousands of jobs neither imports pydantic nor parses each
resource into a model. SQLite in WAL mode with a busy timeout lets many CLI processes and
supervisors read and write at once.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from aiptrain.errors import EnvironmentNotReady
from aiptrain.filtering import COLUMNS, Condition, Query, listed_only

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id      TEXT PRIMARY KEY,
    state       TEXT NOT NULL,
    create_time TEXT NOT NULL,
    resource    TEXT NOT NULL,              -- the Job resource, camelCase JSON
    restarts    TEXT NOT NULL DEFAULT '{}', -- task name -> restarts so far
    labels      TEXT,                       -- the resource's labels (JSON), or NULL
    backend     TEXT                        -- what runs its replicas (aiptrain.backends), NULL for docker
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
"""
# Columns added after the first release: name -> how to fill it in from the stored resource.
ADDED_COLUMNS = {"labels": "json_extract(resource, '$.labels')", "backend": "'docker'"}
# The columns `jobs list` prints from without reading the resource, by the resource's key.
LISTED = {**COLUMNS, "labels": "labels"}
# The states of aiptrain.model.State that are not TERMINAL_STATES, spelled out here so that this
# module need not import the model; named rather than "not terminal" so the state index finds them.
ACTIVE = ("STATE_UNSPECIFIED", "QUEUED", "PREPARING", "RUNNING", "CANCELLING")
# The labels column is a copy of the resource's labels, written again by any change of them.
LABELS_REWRITTEN = "an `aiptrain jobs update` that changes its labels writes the column again"
_SQL_OPERATORS = {"<": "<", "<=": "<=", ">": ">", ">=": ">="}


class StoreUnusable(EnvironmentNotReady):
    """The job store's file cannot be used: damaged, unreadable, or on a full disk."""


class DamagedRecord(EnvironmentNotReady):
    """One job's row in the store cannot be read; the other jobs can."""

    def __init__(self, job_id: str, path: Path, problem: str):
        self.job_id, self.problem = job_id, problem
        super().__init__(
            f"The record of job [{job_id}] in the job store [{path}] is damaged ({problem}); the other jobs are "
            f"unaffected: restore the store from a backup, or forget the job with "
            f"`sqlite3 {path} \"DELETE FROM jobs WHERE job_id = '{job_id}'\"`."
        )


def store_problem(path: Path, exc: Exception) -> StoreUnusable:
    """One line naming the store file, what is wrong with it and what to do."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
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


def warn_on_stderr(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr, flush=True)


class JobTable:
    def __init__(self, path: Path, warn: Callable[[str], None] = warn_on_stderr):
        self.path = path
        self._warn = warn
        self._warned: set[str] = set()  # jobs whose damaged record was reported already
        self._db = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._ensure_schema()
        except (sqlite3.DatabaseError, OSError) as exc:
            if self._db is not None:
                self._db.close()
            raise store_problem(path, exc) from None

    def skip_damaged(self, job_id: str, problem: str,
                     consequence: str = "it is left out; `aiptrain jobs describe` on it says what to do") -> None:
        """Say once, in one line, that a job's record is damaged, and what that does here."""
        if job_id not in self._warned:
            self._warned.add(job_id)
            self._warn(f"The record of job [{job_id}] in the job store [{self.path}] is damaged ({problem}): "
                       f"{consequence}.")

    def _ensure_schema(self) -> None:
        """WAL mode, the tables and the added columns, set up once per database file. Every CLI
        process opens the store, many at once: only the first must write, and it does so inside
        BEGIN IMMEDIATE, which waits for the lock (an autocommit CREATE that reads the schema,
        then finds another process changed it, fails at once with "database is locked")."""
        for attempt in range(100):  # WAL is kept in the file: only a new database switches
            try:
                if self._db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    self._db.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:  # another process is switching it right now
                if "locked" not in str(exc) or attempt == 99:
                    raise
                time.sleep(0.05)
        if not self._schema_is_current():
            with self._transaction():
                for statement in filter(str.strip, (SCHEMA + INDEXES).split(";")):
                    self._db.execute(statement)
                self._add_columns()

    def _schema_is_current(self) -> bool:
        tables = {name for (name,) in self._db.execute("SELECT name FROM sqlite_master")}
        return {"jobs", "events", "verdicts", "jobs_by_state", "admission"} <= tables and not self._missing_columns()

    def _missing_columns(self) -> list[str]:
        present = {row[1] for row in self._db.execute("PRAGMA table_info(jobs)")}
        return [name for name in ADDED_COLUMNS if name not in present]

    def _add_columns(self) -> None:
        """Columns a database made before them lacks, filled in from each stored resource (under
        the write lock the caller holds, so no row is written meanwhile)."""
        for name in self._missing_columns():
            self._db.execute(f"ALTER TABLE jobs ADD COLUMN {name} TEXT")
            self._db.execute(f"UPDATE jobs SET {name} = {ADDED_COLUMNS[name]}")

    def close(self) -> None:
        if self._db is not None:
            self._db.close()

    def __enter__(self) -> JobTable:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _transaction(self):
        return _Immediate(self._db)

    def exists(self, job_id: str) -> bool:
        return self._db.execute("SELECT 1 FROM jobs WHERE job_id = ?", (job_id,)).fetchone() is not None

    def backend_of(self, job_id: str) -> str:
        """The backend that runs the job (docker for a job the store does not know)."""
        row = self._db.execute("SELECT backend FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return (row and row[0]) or "docker"

    def job_ids(self, prefix: str = "") -> list[str]:
        """IDs starting with `prefix` (case-sensitive), newest first."""
        rows = self._db.execute(
            "SELECT job_id FROM jobs WHERE substr(job_id, 1, ?) = ? ORDER BY create_time DESC, job_id",
            (len(prefix), prefix),
        ).fetchall()
        return [job_id for (job_id,) in rows]

    def active_job_ids(self) -> list[str]:
        rows = self._db.execute(
            f"SELECT job_id FROM jobs WHERE state IN ({','.join('?' * len(ACTIVE))})", ACTIVE
        ).fetchall()
        return [job_id for (job_id,) in rows]

    def resources(self, query: Query, fields: Iterable[str] | None = None) -> list[dict]:
        """The resources of the jobs meeting the query's conditions, in its order (newest first
        by default), at most its limit. `fields`: the only keys the caller reads; when the
        columns hold them all (filtering.listed_only), the resources are made of those columns
        alone, without reading or parsing the stored JSON."""
        where, params = [], []
        for condition in query.conditions:
            clause, values = _sql_condition(condition)
            where.append(clause)
            params += values
        order = []
        for key in query.order:
            expression, values = _sql_sort_key(key.key)
            order.append(f"{expression} {'DESC' if key.descending else 'ASC'}")
            params += values
        if any(key not in COLUMNS for key in [c.key for c in query.conditions] + [k.key for k in query.order]):
            self._report_damaged_labels()
        keys = _listed_keys(fields)
        sql = f"SELECT job_id, {'resource' if keys is None else ', '.join(LISTED[key] for key in keys)} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY " + ", ".join([*order, "create_time DESC", "job_id"])  # ties: newest first, as unsorted
        skipped = 0  # damaged rows are left out: the limit then reaches as many rows further
        while True:
            limit = [query.limit + skipped] if query.limit else []
            rows = self._db.execute(sql + (" LIMIT ?" if limit else ""), [*params, *limit]).fetchall()
            found = [r for r in (self._row_resource(keys, row) for row in rows) if r is not None]
            if not limit or len(found) >= query.limit or len(rows) < limit[0]:
                return found[:query.limit] if limit else found
            skipped = len(rows) - len(found)

    def _report_damaged_labels(self) -> None:
        """Jobs whose labels column is damaged: SQL on labels reads them as having none, so say so."""
        rows = self._db.execute("SELECT job_id FROM jobs WHERE labels IS NOT NULL AND NOT json_valid(labels)")
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


def _label_path(key: str) -> str:
    """The JSON path of `labels.KEY` inside the labels column (KEY quoted: it may hold `-`)."""
    return f'$."{key.split(".", 1)[1]}"'


def _sql_sort_key(key: str) -> tuple[str, list]:
    if key in COLUMNS:
        return COLUMNS[key], []
    # A damaged labels column has no labels, rather than failing the query of every job.
    return "CASE WHEN json_valid(labels) THEN json_extract(labels, ?) END", [_label_path(key)]


def _sql_condition(condition: Condition) -> tuple[str, list]:
    column, params = _sql_sort_key(condition.key)
    value = condition.value
    if condition.op == "IN":
        return f"{column} IN ({','.join('?' * len(value))})", [*params, *value]
    if condition.op == "NOT_IN":  # a missing label is not any of the values
        return f"coalesce({column} NOT IN ({','.join('?' * len(value))}), 1)", [*params, *value]
    if condition.op == "PREFIX":
        return f"substr({column}, 1, ?) = ?", [*params, len(value), value]
    if condition.op == "CONTAINS_NOCASE":
        return f"instr(lower({column}), ?) > 0", [*params, value.lower()]
    return f"{column} {_SQL_OPERATORS[condition.op]} ?", [*params, value]


class _Immediate:
    """`with` block that runs inside BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error)."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")

"""Where the job store's two databases differ: SQLite, a file in the home (the embedded default),
and PostgreSQL (`AIPTRAIN_STORE=postgresql://...`, a team server's store).

aiptrain.jobtable writes its SQL once, in SQLite's spelling with `?` placeholders; a dialect
connects, runs that SQL (PostgreSQL's turns `?` into `%s`), opens write transactions, and
supplies the few expressions the two spell differently. Both serialize writers the same way:
SQLite's `BEGIN IMMEDIATE` takes the database's one write lock, PostgreSQL's transactions take
one transaction-level advisory lock first. So every compare-and-set (a transition, the admission
queue, a label update) reads and writes with no other writer in between, on either database,
while readers never wait.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from aiptrain.errors import EnvironmentNotReady

# The advisory lock PostgreSQL writers take (any constant; only aiptrain's writers use it).
WRITE_LOCK = 0x61697074  # "aipt"
# Seconds a PostgreSQL server that does not answer gets before the command gives up (exit 3).
CONNECT_TIMEOUT_SECONDS = 10
POSTGRES_SCHEMES = ("postgresql", "postgres")


def is_postgres_url(location: str | Path) -> bool:
    return isinstance(location, str) and location.split("://", 1)[0] in POSTGRES_SCHEMES


def shown_url(url: str) -> str:
    """The URL as messages show it: scheme, user, host, port and database, never the password
    (nor the query string, where one may be given too)."""
    if "://" not in url:  # not a URL: at most what follows a user's `@`
        return url.rsplit("@", 1)[-1]
    try:
        parts = urlsplit(url)
        user = f"{parts.username}@" if parts.username else ""
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is not a number, and the like: show only the scheme
        return f"{url.split('://', 1)[0]}://..."
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"


def passwords_in(url: str) -> list[str]:
    """The password a URL holds (as written and decoded, in its user part or a `password=` parameter)."""
    try:
        parts = urlsplit(url)
        found = [parts.password or "", *parse_qs(parts.query).get("password", [])]
    except ValueError:
        return []
    return sorted({secret for p in found if p for secret in (p, unquote(p))}, key=len, reverse=True)


class StoreUnusable(EnvironmentNotReady):
    """The job store's file cannot be used: damaged, unreadable, or on a full disk; or its
    database's driver is missing (raised here, where the dialect is chosen)."""


def connect(location: str | Path) -> Dialect:
    return PostgresDialect(str(location)) if is_postgres_url(location) else SQLiteDialect(Path(location))


class SQLiteDialect:
    """The home's jobs.db in WAL mode with a busy timeout: many CLI processes and the controller
    read and write it at once."""

    integrity_errors: tuple[type[Exception], ...] = (sqlite3.IntegrityError,)

    def __init__(self, path: Path):
        self.where = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._use_wal()
        except BaseException:
            self._db.close()
            raise

    def _use_wal(self) -> None:
        for attempt in range(100):  # WAL is kept in the file: only a new database switches
            try:
                if self._db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:  # another process is switching it right now
                if "locked" not in str(exc) or attempt == 99:
                    raise
                time.sleep(0.05)

    def execute(self, sql: str, params=()) -> sqlite3.Cursor:
        return self._db.execute(sql, params)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE waits for the write lock (a deferred BEGIN that reads, then finds
        another process wrote meanwhile, would fail at once with "database is locked")."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()

    def schema_names(self) -> set[str]:
        """The tables and indexes there are."""
        return {name for (name,) in self._db.execute("SELECT name FROM sqlite_master")}

    def columns(self, table: str) -> set[str]:
        return {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}

    def ddl(self, statement: str) -> str:
        return statement

    extra_schema: tuple[str, ...] = ()

    def json_member(self, document: str) -> str:
        """The text of one member of a JSON object column; the member's path is the parameter."""
        return f"json_extract({document}, ?)"

    def member_path(self, key: str) -> str:
        return f'$."{key}"'  # quoted: a label key may hold `-`

    def json_valid(self, document: str) -> str:
        return f"json_valid({document})"

    def contains(self, text: str) -> str:
        return f"instr({text}, ?) > 0"

    def forget_command(self, job_id: str) -> str:
        return f"sqlite3 {self.where} \"DELETE FROM jobs WHERE job_id = '{job_id}'\""


class PostgresDialect:
    """A PostgreSQL database (psycopg 3), autocommit outside the store's write transactions. A
    connection the server dropped (a restart, an idle timeout) is made again before the next
    read or transaction, so a long-lived controller outlives a restart of the server."""

    # Text compares and sorts byte by byte, as in SQLite, whatever the database's locale.
    _DDL = (
        (" TEXT", ' TEXT COLLATE "C"'),
        ("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"),
        # Every SQLite table has a rowid, the order rows were inserted in; events are read in it.
        ("TABLE IF NOT EXISTS events (", "TABLE IF NOT EXISTS events (\n    rowid BIGINT GENERATED ALWAYS AS IDENTITY,"),
    )
    # SQLite's json_valid: PostgreSQL 15 has no `IS JSON`, so parse in a function that says no.
    extra_schema = ("""
CREATE OR REPLACE FUNCTION aiptrain_json_valid(document text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM document::jsonb;
    RETURN TRUE;
EXCEPTION WHEN others THEN
    RETURN FALSE;
END $$""",)

    def __init__(self, url: str):
        self.where = shown_url(url)
        try:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict, make_conninfo
        except ImportError:
            raise StoreUnusable(
                f"AIPTRAIN_STORE names a PostgreSQL store [{self.where}], but psycopg, its driver, is not "
                "installed: pip install 'aiptrain[postgresql]' (or unset AIPTRAIN_STORE for the SQLite store)."
            ) from None
        self.integrity_errors = (psycopg.IntegrityError,)
        self._dropped = psycopg.OperationalError
        given = conninfo_to_dict(url)
        defaults: dict[str, str | int] = {"connect_timeout": CONNECT_TIMEOUT_SECONDS, "application_name": "aiptrain"}
        self._conninfo = make_conninfo(url, **{key: value for key, value in defaults.items() if key not in given})
        self._connect = lambda: psycopg.connect(self._conninfo, autocommit=True)
        self._db = self._connect()
        self._in_transaction = False

    def execute(self, sql: str, params=()):
        sql = sql.replace("?", "%s")
        if self._in_transaction:
            return self._db.execute(sql, params or None)
        return self._again_if_dropped(lambda: self._db.execute(sql, params or None))

    def _again_if_dropped(self, action):
        """`action`, once more on a new connection if the server had dropped this one. Only reads
        and BEGIN run outside a transaction, so running one again is safe."""
        if self._db.closed or self._db.broken:
            self._db = self._connect()
        try:
            return action()
        except self._dropped:
            if not self._db.broken:
                raise
            self._db = self._connect()
            return action()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """READ COMMITTED: each statement after the lock sees every write committed before it."""
        self._again_if_dropped(lambda: self._db.execute("BEGIN"))
        self._in_transaction = True
        try:
            self._db.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
            yield
        except BaseException:
            if not self._db.broken:
                self._db.execute("ROLLBACK")
            raise
        else:
            self._db.execute("COMMIT")
        finally:
            self._in_transaction = False

    def close(self) -> None:
        self._db.close()

    def schema_names(self) -> set[str]:
        rows = self._db.execute("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                                "WHERE n.nspname = current_schema()")
        return {name for (name,) in rows}

    def columns(self, table: str) -> set[str]:
        rows = self._db.execute("SELECT column_name FROM information_schema.columns "
                                "WHERE table_schema = current_schema() AND table_name = %s", (table,))
        return {name for (name,) in rows}

    def ddl(self, statement: str) -> str:
        for sqlite_text, postgres_text in self._DDL:
            statement = statement.replace(sqlite_text, postgres_text)
        return statement

    def json_member(self, document: str) -> str:
        return f'(({document})::jsonb ->> ?::text) COLLATE "C"'

    def member_path(self, key: str) -> str:
        return key

    def json_valid(self, document: str) -> str:
        return f"aiptrain_json_valid({document})"

    def contains(self, text: str) -> str:
        return f"strpos({text}, ?) > 0"

    def forget_command(self, job_id: str) -> str:
        return f"psql '{self.where}' -c \"DELETE FROM jobs WHERE job_id = '{job_id}'\""


Dialect = SQLiteDialect | PostgresDialect

"""The job store in PostgreSQL (AIPTRAIN_STORE): what the user sees when it cannot be used, and
the schema migrations on a database made before them. The store's behaviour on both databases
is tested by the tests over the `store_location` fixture (tests/unit/test_store.py and others)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from pgserver import PASSWORD

from aiptrain import filtering
from aiptrain.errors import ValidationError
from aiptrain.model import Job, State
from aiptrain.settings import Settings
from aiptrain.store import JobStore

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "STORAGE_EMULATOR_HOST": ""}


def aiptrain(store: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aiptrain", *args], capture_output=True, text=True,
                          env={**os.environ, **NO_ENGINE, "AIPTRAIN_STORE": store}, timeout=120)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once it is closed


def test_the_variable_names_the_store(monkeypatch, tmp_path):
    monkeypatch.setenv("AIPTRAIN_HOME", str(tmp_path))
    monkeypatch.delenv("AIPTRAIN_STORE", raising=False)
    assert Settings().store == tmp_path / "jobs.db"
    monkeypatch.setenv("AIPTRAIN_STORE", "postgresql://u:pw@db.example:5432/aiptrain")
    assert Settings().store == "postgresql://u:pw@db.example:5432/aiptrain"
    assert "pw" not in repr(Settings())
    monkeypatch.setenv("AIPTRAIN_STORE", "mysql://u:hidden-pw@db.example/aiptrain")
    with pytest.raises(ValidationError, match=r"AIPTRAIN_STORE \[mysql://u@db.example/aiptrain\] is not a Postgre") as error:
        Settings()
    assert "hidden-pw" not in str(error.value)


@pytest.mark.parametrize("command", [["jobs", "list"], ["jobs", "describe", "some_job"]])
def test_an_unreachable_store_is_one_line_without_the_password_exit_3(home, command):
    port = _closed_port()
    result = aiptrain(f"postgresql://aiptrain:{PASSWORD}@127.0.0.1:{port}/jobs", *command)
    assert result.returncode == 3 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"ERROR: The job store [postgresql://aiptrain@127.0.0.1:{port}/jobs] cannot be used")
    assert "Connection refused" in result.stderr and PASSWORD not in result.stderr + result.stdout


def test_a_wrong_password_is_one_line_without_it_exit_3(home, postgres_server):
    result = aiptrain(postgres_server.url(password="Wrong-Pw-123"), "jobs", "list")
    assert result.returncode == 3 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "password authentication failed" in result.stderr and "Wrong-Pw-123" not in result.stderr


def test_a_bad_store_variable_is_exit_2(home):
    result = aiptrain("sqlite:///tmp/x.db", "jobs", "list")
    assert result.returncode == 2 and result.stderr.startswith("ERROR: AIPTRAIN_STORE [sqlite:///tmp/x.db] is not")


OLD_SCHEMA = """
CREATE TABLE jobs (job_id TEXT PRIMARY KEY, state TEXT NOT NULL, create_time TEXT NOT NULL,
                   resource TEXT NOT NULL, restarts TEXT NOT NULL DEFAULT '{}')
"""


def test_a_database_made_before_the_added_columns_takes_them_on(postgres_url):
    """The same migration steps as SQLite's (tests/cli/test_jobs_list.py): the columns added since,
    filled in from each stored resource, and the indexes and tables. (No PostgreSQL store predates
    the events table's rowid, which PostgreSQL's has from the start: the jobs table stands for it.)"""
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute(OLD_SCHEMA)
        for job_id, labels in (("old", {"team": "ml"}), ("older", None)):
            resource = {"jobId": job_id, "state": "SUCCEEDED", "createTime": f"2025-01-0{len(job_id)}T00:00:00Z",
                        **({"labels": labels} if labels else {})}
            db.execute("INSERT INTO jobs VALUES (%s, 'SUCCEEDED', %s, %s, '{}')",
                       (job_id, resource["createTime"], json.dumps(resource)))
    with JobStore(postgres_url) as store:
        assert {"jobs_by_state", "jobs_by_create_time", "verdicts", "admission"} <= store._db.schema_names()
        rows = store._db.execute("SELECT job_id, labels, backend FROM jobs ORDER BY job_id").fetchall()
        assert [(job_id, labels and json.loads(labels), backend) for job_id, labels, backend in rows] == [
            ("old", {"team": "ml"}, "docker"), ("older", None, "docker")]
        by_label = filtering.plan_query(filtering.parse("labels.team=ml"), (), None)
        assert [r["jobId"] for r in store.resources(by_label, ["jobId", "labels.team"])] == ["old"]


def test_a_store_outlives_a_restart_of_the_server(postgres_server, postgres_url):
    """The controller keeps its store open for as long as it runs: a restarted server costs it nothing."""
    store = JobStore(postgres_url)
    store.create(Job(job_id="a"))
    postgres_server.restart()
    assert store.get("a").state is State.QUEUED  # a read, on a new connection
    postgres_server.restart()
    assert store.transition("a", State.PREPARING, [State.QUEUED]).state is State.PREPARING  # a write
    assert [state for _, state, _ in store.events("a")] == ["QUEUED", "PREPARING"]
    store.close()

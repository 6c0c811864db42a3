"""Issue 21, item 8: a damaged job store. A store file that is not a database (or is damaged
inside) is one line naming the file and what to do, exit 3, on every command; one row that cannot
be read is reported once (a WARNING line naming the job) and left out, never hiding the others."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest
from pgserver import PASSWORD

from aiptrain.dialects import shown_url
from aiptrain.model import Job, State
from aiptrain.settings import Settings
from aiptrain.store import JobStore

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "STORAGE_EMULATOR_HOST": ""}


def aiptrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aiptrain", *args], capture_output=True, text=True,
                          env={**os.environ, **NO_ENGINE}, timeout=120)


def test_a_store_that_is_not_a_database_is_one_line_naming_it_on_every_command(home, tmp_path):
    home.mkdir(parents=True)
    store = home / "jobs.db"
    store.write_bytes(os.urandom(8192))
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").touch()
    for args in (["jobs", "list"], ["jobs", "describe", "some_job"], ["jobs", "cancel", "some_job"],
                 ["jobs", "submit", "training", "new_job", "--package-path", str(package), "--module-name", "t.m"]):
        result = aiptrain(*args)
        lines = result.stderr.splitlines()
        assert result.returncode == 3 and len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith(f"ERROR: The job store [{store}] cannot be used (file is not a database)")
        assert f"mv {store} {store}.damaged" in lines[0]


def test_a_store_damaged_inside_is_one_line_when_a_command_reaches_the_damage(home):
    """The header is fine, so the store opens; a page holding rows is not."""
    home.mkdir(parents=True)
    with JobStore(home / "jobs.db") as store:
        for index in range(40):
            store.create(Job.model_validate({"jobId": f"job{index}", "labels": {"pad": "x" * 60}}))
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray((home / "jobs.db").read_bytes())
    page = 4096
    for start in range(page, len(data), page):  # every page after the schema's: headers and cells
        data[start:start + 64] = b"\xff" * 64
    (home / "jobs.db").write_bytes(bytes(data))
    result = aiptrain("jobs", "list", "--format", "json")
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith(f"ERROR: The job store [{home / 'jobs.db'}] cannot be used (")
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr


@pytest.fixture(params=["sqlite", "postgresql"])
def damaged(request, home, monkeypatch):
    """Five jobs; job_b's resource is not JSON, job_c's labels column is not JSON, job_d's resource
    is JSON but not an object. job_b is RUNNING with nobody driving it, so listing reconciles it.
    Once in the home's SQLite file, once in PostgreSQL (AIPTRAIN_STORE)."""
    home.mkdir(parents=True)
    if request.param == "postgresql":
        monkeypatch.setenv("AIPTRAIN_STORE", request.getfixturevalue("postgres_url"))
    with JobStore(Settings().store) as store:
        for job_id in ("job_a", "job_b", "job_c", "job_d", "job_e"):
            store.create(Job.model_validate({"jobId": job_id, "labels": {"team": "ml"}}))
            store.transition(job_id, State.SUCCEEDED, [State.QUEUED])
        # Created in one second, even when the loop straddles one: listings order ties by job ID.
        store._db.execute("UPDATE jobs SET create_time = (SELECT MIN(create_time) FROM jobs)")
        store._db.execute("UPDATE jobs SET resource = 'not json{', state = 'RUNNING' WHERE job_id = 'job_b'")
        store._db.execute("UPDATE jobs SET labels = '{broken' WHERE job_id = 'job_c'")
        store._db.execute("UPDATE jobs SET resource = '[1, 2]' WHERE job_id = 'job_d'")
    return home


def shown(store) -> str:
    """The store as messages name it: the SQLite file, or the URL without its password."""
    return shown_url(store) if isinstance(store, str) else str(store)


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("WARNING: ")]


def listed(run, *args: str) -> tuple[list[str], str]:
    code, out, err = run("jobs", "list", "--format", "json", *args)
    assert code == 0, err
    return sorted(resource["jobId"] for resource in json.loads(out or "[]")), err


def test_a_damaged_row_is_reported_once_and_left_out_of_a_listing(run, damaged):
    found, err = listed(run)
    assert found == ["job_a", "job_c", "job_e"]
    lines = warnings(err)
    assert len(lines) == 2 and len(err.splitlines()) == 2, err
    assert "[job_b]" in lines[0] and f"[{shown(Settings().store)}]" in lines[0]
    assert PASSWORD not in err


@pytest.mark.parametrize("args, expected", [
    (["--filter", "labels.team=ml"], ["job_a", "job_e"]),  # in SQL, on the labels column
    (["--filter", "labels.team:ml AND state:SUCCEEDED"], ["job_a", "job_e"]),
    (["--filter", "jobId:job*"], ["job_a", "job_c", "job_e"]),  # in Python, on the resources
    (["--sort-by", "labels.team"], ["job_a", "job_c", "job_e"]),
    (["--limit", "2"], ["job_a", "job_c"]),  # one create time: by job ID; job_b left out, job_c in
    (["--filter", "state=SUCCEEDED", "--limit", "3"], ["job_a", "job_c", "job_e"]),  # SQL, LIMIT past the bad rows
])
def test_filters_sorts_and_limits_skip_damaged_rows(run, damaged, args, expected):
    found, err = listed(run, *args)
    assert found == expected
    assert all("is damaged" in line for line in err.splitlines()), err
    if "labels." in " ".join(args):  # read from the labels column in SQL: its damage is said too
        assert any("[job_c]" in line for line in warnings(err))


def test_table_columns_and_labels_read_without_resources(run, damaged):
    code, out, err = run("jobs", "list", "--format", "table(jobId,labels)")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["job_a", "job_b", "job_d", "job_e"]
    assert any("[job_c]" in line for line in warnings(err))


def test_describe_of_a_damaged_job_says_what_to_do_and_others_still_work(run, damaged):
    code, out, err = run("jobs", "describe", "job_b")
    assert code == 3 and out == ""
    assert err.startswith("ERROR: The record of job [job_b] in the job store [")
    assert "DELETE FROM jobs WHERE job_id = 'job_b'" in err and len(err.splitlines()) == 1
    assert f"[{shown(Settings().store)}]" in err and PASSWORD not in err
    code, out, _ = run("jobs", "describe", "job_a")
    assert code == 0 and "jobId: job_a" in out


def test_the_store_api_lists_the_readable_jobs(damaged, capsys):
    with JobStore(Settings().store) as store:
        assert [job.job_id for job in store.all()] == ["job_a", "job_c", "job_e"]  # one second: by ID
    assert len(warnings(capsys.readouterr().err)) == 2


def test_store_problems_name_the_file_and_the_way_out(tmp_path):
    from aiptrain.jobtable import store_problem

    path = tmp_path / "jobs.db"
    assert "free space on its disk" in str(store_problem(path, sqlite3.OperationalError("database or disk is full")))
    assert "try again" in str(store_problem(path, sqlite3.OperationalError("database is locked")))
    assert f"mv {path}" in str(store_problem(path, sqlite3.DatabaseError("database disk image is malformed")))
    assert store_problem(path, sqlite3.DatabaseError("x")).exit_code == 3

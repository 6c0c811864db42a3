"""Job IDs per project (aiptrain.jobkeys): the key rule, the store keyed by it, and the migration
of a store made by the release before (tests/unit/data/home-8debb90, on SQLite and PostgreSQL)."""

from __future__ import annotations

import hashlib
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from aiptrain import filtering
from aiptrain.client import Client
from aiptrain.dialects import PostgresDialect
from aiptrain.errors import JobExists, JobNotFound
from aiptrain.jobkeys import KEY_PATTERN, new_key, project_label, qualified_key
from aiptrain.labels import LABEL_JOB
from aiptrain.model import Job, ScaleTier, State
from aiptrain.planning import plan
from aiptrain.settings import Settings
from aiptrain.store import JobStore
from aiptrain.topology import replicas_for

from test_planning import INPUTS, make_job

PREVIOUS_HOME = Path(__file__).parent / "data" / "home-8debb90"
DEFAULT = "aiptrain"
# The strictest of the engine's names, a Swarm service's (swarmkit's isValidDNSName; a container's allows `.` too).
SWARM_SERVICE_NAME = re.compile(r"[a-zA-Z0-9](?:[-_]*[A-Za-z0-9]+)*")


# -- the rule (pure) ----------------------------------------------------------------------------

@pytest.mark.parametrize("project, job_id, taken, key", [
    (DEFAULT, "census_1", False, "census_1"),  # the default project keeps plain IDs
    (DEFAULT, "census_1", True, "aiptrain--census_1"),  # another project's older job holds the plain key
    ("team-a", "census_1", False, "team-a--census_1"),
    ("team-a", "census_1", True, "team-a--census_1"),
    ("Team.A:x", "j", False, "P" + hashlib.sha256(b"Team.A:x").hexdigest()[:16] + "--j"),
    ("a--b", "j", False, "P" + hashlib.sha256(b"a--b").hexdigest()[:16] + "--j"),
])
def test_the_key_of_a_new_job(project, job_id, taken, key):
    assert new_key(project, job_id, DEFAULT, taken) == key
    assert KEY_PATTERN.fullmatch(key)


def test_keys_and_the_names_built_on_them_stay_distinct():
    """A project label holds no `--` and a job ID no `-`: `<key>-trial-3` of one job is never
    another job's `<key>`, and digests never pass for a plain project ID."""
    assert qualified_key("team-a", "x") + "-trial-3" != qualified_key("team-a-trial-3", "x")
    assert project_label("team-a") == "team-a" and project_label("Team-a").startswith("P")
    for odd in ("a" * 31, "example.com:p", "ends-", "a--b"):
        assert project_label(odd).startswith("P") and SWARM_SERVICE_NAME.fullmatch(project_label(odd))


def test_engine_names_carry_the_key_and_hostnames_the_id():
    job = make_job(scale_tier=ScaleTier.STANDARD_1).model_copy(update={"job_id": "census_1"})
    ours = plan(job, replicas_for(job.training_input), INPUTS, key="team-a--census_1")
    theirs = plan(job, replicas_for(job.training_input), INPUTS, key="team-b--census_1")
    assert {c.name for c in ours.containers}.isdisjoint(c.name for c in theirs.containers)
    assert ours.network and theirs.network and ours.network.name == "aiptrain-team-a--census_1"
    assert {c.labels[LABEL_JOB] for c in ours.containers} == {"team-a--census_1"}
    assert [c.hostname for c in ours.containers] == [c.hostname for c in theirs.containers]
    assert ours.containers[0].hostname == "census-1-master-0"
    assert all(SWARM_SERVICE_NAME.fullmatch(c.name) for c in ours.containers + theirs.containers)


# -- the store ----------------------------------------------------------------------------------

def test_two_projects_hold_the_same_id(store_location):
    with JobStore(store_location) as store:
        store.create(Job(job_id="census_1", labels={"team": "a"}), project=DEFAULT)
        store.create(Job(job_id="census_1", labels={"team": "b"}), project="team-b")
        with pytest.raises(JobExists, match=r"Job \[census_1\] already exists"):
            store.create(Job(job_id="census_1"), project="team-b")
        assert store.key_of(DEFAULT, "census_1") == "census_1"
        assert store.key_of("team-b", "census_1") == "team-b--census_1"
        assert store.get("team-b--census_1").labels == {"team": "b"}
        assert store.project_of("team-b--census_1") == "team-b"
        every = filtering.plan_query(None, (), None)
        assert [r["labels"] for r in store.resources(every, ["jobId", "labels"], "team-b")] == [{"team": "b"}]
        assert store.job_ids("team-b") == ["census_1"] and store.job_ids("nobody") == []


# -- the migration of a store the previous release made --------------------------------------------

@pytest.fixture(params=["sqlite", "postgresql"])
def previous_store(request, tmp_path) -> tuple[str | Path, Path]:
    """(the store, the home's logs) as the release before job IDs per project left them: the
    fixture's SQLite file, or its rows in a PostgreSQL database made with that release's schema."""
    home = tmp_path / "home"
    shutil.copytree(PREVIOUS_HOME, home)
    if request.param == "sqlite":
        return home / "jobs.db", home / "logs"
    url = request.getfixturevalue("postgres_url")
    _copy_to_postgres(home / "jobs.db", url)
    return url, home / "logs"


def _copy_to_postgres(sqlite_file: Path, url: str) -> None:
    """The SQLite store's tables (as that release's SQL made them) and rows, in PostgreSQL."""
    source = sqlite3.connect(sqlite_file)
    dialect = PostgresDialect(url)
    try:
        for (sql,) in source.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL "
                                        "AND name != 'sqlite_sequence' ORDER BY type DESC"):
            sql = sql.replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ", 1)
            dialect.execute(dialect.ddl(sql))
        for table in ("jobs", "events", "verdicts", "admission"):
            cursor = source.execute(f"SELECT * FROM {table} ORDER BY rowid")
            columns = [d[0] for d in cursor.description]
            for row in cursor:
                dialect.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(row))})",
                                row)
    finally:
        dialect.close()
        source.close()


def test_a_previous_releases_store_migrates_in_place(previous_store):
    location, logs = previous_store
    with JobStore(location, default_project=DEFAULT, legacy_logs=logs) as store:
        # Every job keeps its ID as its key, in the project its `.project` file named, else the default.
        assert {(p, store.key_of(p, j)) for p, j in [("team-a", "census_1"), (DEFAULT, "census_2"),
                                                      ("team-b", "census_3"), (DEFAULT, "waiting")]} == {
            ("team-a", "census_1"), (DEFAULT, "census_2"), ("team-b", "census_3"), (DEFAULT, "waiting")}
        assert store.key_of(DEFAULT, "census_1") is None and store.key_of("team-b", "census_1") is None
        every = filtering.plan_query(None, (), None)
        assert [r["jobId"] for r in store.resources(every, ["jobId"], DEFAULT)] == ["waiting", "census_2"]
        assert [r["jobId"] for r in store.resources(every, project="team-a")] == ["census_1"]
        # What the jobs had is theirs still: states, events, restarts, the admission queue.
        assert store.get("census_2").state is State.FAILED and store.get("census_1").labels == {"team": "a"}
        assert [state for _, state, _ in store.events("census_1")] == ["QUEUED", "SUCCEEDED"]
        assert store.restarts("census_3") == {"master-replica-0": 1}
        assert store.queue_position("waiting") == (1, "Waiting for room.")
        # Another project may now take an ID that one holds; the same project may not.
        store.create(Job(job_id="census_1"), project="team-b")
        store.create(Job(job_id="census_1"), project=DEFAULT)  # its plain key is team-a's
        assert store.key_of("team-b", "census_1") == "team-b--census_1"
        assert store.key_of(DEFAULT, "census_1") == "aiptrain--census_1"
        with pytest.raises(JobExists):
            store.create(Job(job_id="census_1"), project="team-a")
    with JobStore(location, default_project="elsewhere") as store:  # migrated once: the default changes nothing
        assert store.key_of(DEFAULT, "census_2") == "census_2"


def test_a_migrated_home_shows_each_project_its_own_jobs(tmp_path):
    home = tmp_path / "home"
    shutil.copytree(PREVIOUS_HOME, home)
    settings = Settings(home=home, default_project=DEFAULT)
    with Client(settings=settings, project="team-a") as team_a:
        assert team_a.get("census_1").labels == {"team": "a"}
        assert b"Job census_1 is queued." in b"".join(team_a.log_blocks("census_1"))
        with pytest.raises(JobNotFound):
            team_a.get("census_2")
    with Client(settings=settings) as default:
        assert [job.job_id for job in default.list()] == ["waiting", "census_2"]
        with pytest.raises(JobNotFound, match=r"census_1"):
            default.get("census_1")

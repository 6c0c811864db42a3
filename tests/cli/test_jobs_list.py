"""`jobs list` (--filter, --sort-by, --limit, --page-size, --uri, --format) and `jobs update`
labels, against a store of a few hundred jobs inserted directly; the filter grammar table-tested."""

from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
from datetime import datetime, timedelta, timezone

import pytest

from aiptrain import filtering, listing
from aiptrain.client import Client
from aiptrain.errors import JobNotFound, ValidationError
from aiptrain.model import Job, State
from aiptrain.ownership import JobLock
from aiptrain.settings import Settings
from aiptrain.store import JobStore

RESOURCE = {
    "jobId": "census_rnn_7", "state": "FAILED", "createTime": "2026-03-02T10:00:00Z",
    "labels": {"team": "ml", "env": "prod"},
    "trainingInput": {"region": "us-central1", "scaleTier": "BASIC", "args": ["--steps", "10"]},
    "trainingOutput": {"completedTrialCount": "3", "trials": [{"trialId": "2"}, {"trialId": "1"}]},
    "errorMessage": "The replica master 0 exited with a non-zero status of 1.",
}


@pytest.mark.parametrize("expression, expected", [
    ("jobId:census*", True),
    ("jobId:CENSUS*", True),  # `:` ignores case
    ("jobId:rnn", True),  # ... and matches a word of the value
    ("jobId:rnn*", True),
    ("jobId:nn", False),
    ("jobId=census*", True),
    ("jobId=CENSUS*", False),  # `=` is case-sensitive
    ("jobId=census_rnn_7", True),
    ("jobId!=census_rnn_7", False),
    ("state:failed", True),
    ("state=FAILED", True),
    ("state:(RUNNING FAILED)", True),
    ("state:(RUNNING OR QUEUED)", False),
    ("jobId:rnn* AND state:FAILED", True),
    ("jobId:rnn* state:RUNNING", False),  # adjacency is AND
    ("jobId:nope OR state:FAILED", True),
    ("NOT state:FAILED", False),
    ("-state:FAILED", False),
    ("NOT (state:RUNNING OR jobId:x*)", True),
    ("labels.team=ml", True),
    ("labels.team=ML", False),
    ("labels.team:ML", True),
    ("labels:env", True),  # a map has the key
    ("labels.owner:*", False),
    ("labels.env:*", True),
    ("createTime>2026-01-01", True),
    ("createTime<2026-03-02T10:00:01Z", True),
    ("createTime>=2026-03-02T10:00:00Z", True),
    ("createTime>2026-03-02T11:00:00+01:00", False),  # the same instant, not after
    ("trainingOutput.completedTrialCount>2", True),  # numbers as numbers
    ("trainingOutput.completedTrialCount>10", False),
    ("trainingOutput.trials.trialId:1", True),  # any item of a list
    ("trainingOutput.trials[0].trialId=2", True),
    ("trainingInput.args:steps", True),
    ("errorMessage~'status of [0-9]+'", True),
    ("errorMessage!~status", False),
    ("\"non-zero status\"", True),  # a bare value matches any field
    ("us-central1", True),
    ("missing.key:x", False),
    ("missing.key!=x", True),
])
def test_filter_expressions(expression, expected):
    assert filtering.evaluate(filtering.parse(expression), RESOURCE) is expected


@pytest.mark.parametrize("expression, problem", [
    ("", "the expression is empty"),
    ("(state:FAILED", "a `(` is not closed"),
    ("state:FAILED)", "unexpected [)]"),
    ("state:FAILED AND", "the expression ends too early"),
    ("state: AND jobId:x", "a value is missing before [AND]"),
    ("OR state:FAILED", "unexpected [OR]"),
    ("state:()", "an empty list of values"),
])
def test_malformed_filters(expression, problem):
    with pytest.raises(ValidationError, match=re.escape(problem)):
        filtering.parse(expression)


@pytest.mark.parametrize("expression, complete, conditions", [
    ("state:FAILED", True, [("state", "IN", ("FAILED",))]),
    ("state:(running failed)", True, [("state", "IN", ("RUNNING", "FAILED"))]),
    ("state!=FAILED", True, [("state", "NOT_IN", ("FAILED",))]),
    ("state:runn", False, []),  # not a state's name: the words of the value, in Python
    ("jobId=abc*", True, [("jobId", "PREFIX", "abc")]),
    ("jobId=(a b)", True, [("jobId", "IN", ("a", "b"))]),
    ("jobId!=a", True, [("jobId", "NOT_IN", ("a",))]),
    ("jobId=a*c", False, []),
    ("jobId:abc*", False, [("jobId", "CONTAINS_NOCASE", "abc")]),  # a prefilter: words too
    ("createTime>2026-01-01T00:00:00Z AND state=RUNNING", True,
     [("createTime", ">", "2026-01-01T00:00:00Z"), ("state", "IN", ("RUNNING",))]),
    ("createTime:2026", False, []),
    ("state:FAILED OR jobId=a*", False, []),  # only conjunctions are pushed down
    ("labels.team=ml AND state:FAILED", True, [("labels.team", "IN", ("ml",)), ("state", "IN", ("FAILED",))]),
    ("labels.team=(ml nlp)", True, [("labels.team", "IN", ("ml", "nlp"))]),
    ("labels.my-key=m*", True, [("labels.my-key", "PREFIX", "m")]),
    ("labels.team!=ml", True, [("labels.team", "NOT_IN", ("ml",))]),
    ("labels.team:ML", False, [("labels.team", "CONTAINS_NOCASE", "ML")]),
    ("labels.team:é", False, []),  # SQLite's lower() is ASCII-only
    ("labels.team:*", False, []),
    ("labels:team", False, []),  # the map itself: in Python
    ("labels.a.b=x", False, []),
    ("NOT state:FAILED", False, []),
    ("state:*", False, []),
])
def test_what_the_store_answers(expression, complete, conditions):
    query = filtering.plan_query(filtering.parse(expression), (), 5)
    assert query.complete is complete
    assert [(c.key, c.op, c.value) for c in query.conditions] == conditions
    assert query.limit == (5 if complete else None)


@pytest.mark.parametrize("sort_by, in_sql", [
    ("~createTime,jobId", True), ("state,labels.team", True), ("~labels.n", True),
    ("labels", False), ("trainingInput.region", False), ("labels.a.b", False),
])
def test_what_the_store_sorts(sort_by, in_sql):
    keys = filtering.parse_sort_keys(sort_by)
    query = filtering.plan_query(None, keys, 3)
    assert (query.order, query.complete, query.limit) == ((keys, True, 3) if in_sql else ((), False, None))


@pytest.mark.parametrize("fields, listed", [
    (["jobId", "state", "createTime"], True), (["labels.team", "labels"], True),
    (["jobId", "trainingInput.region"], False), (["labels.a.b"], False),
])
def test_which_fields_the_columns_hold(fields, listed):
    assert filtering.listed_only(fields) is listed


def test_sort_keys():
    assert filtering.parse_sort_keys("~createTime, jobId") == (
        filtering.SortKey("createTime", True), filtering.SortKey("jobId"))
    assert filtering.plan_query(None, filtering.parse_sort_keys("trainingInput.region"), 3).complete is False
    with pytest.raises(ValidationError, match=r"--sort-by \[~\] is not a field name"):
        filtering.parse_sort_keys("~")


# --- a store of a few hundred jobs -------------------------------------------------------------

START = datetime(2026, 1, 1, tzinfo=timezone.utc)
STATES = [State.SUCCEEDED, State.FAILED, State.CANCELLED, State.RUNNING]
COUNT = 300


def _fill(store: JobStore) -> list[dict]:
    """COUNT jobs, one an hour, cycling through states and teams; returns their resources."""
    for n in range(COUNT):
        labels = {"team": ["ml", "vision"][n % 2], "n": str(n)}
        labels.update({"my-key": f"v{n % 3}"} if n % 5 == 0 else {})
        labels = None if n % 11 == 0 else labels
        job = Job(job_id=f"{'census' if n % 3 == 0 else 'mnist'}_{n:03d}", create_time=START + timedelta(hours=n),
                  labels=labels)
        store.create(job)
        state = STATES[n % len(STATES)]
        if state is not State.QUEUED:
            store.transition(job.job_id, state, [State.QUEUED])
    return [job.to_resource() for job in store.all()]


def _hold_running(settings: Settings, resources: list[dict]) -> list[JobLock]:
    """The RUNNING jobs' locks, as if their submits were still at work (the controller that listing
    starts leaves such jobs alone)."""
    return [JobLock.try_acquire(settings.job_paths(r["jobId"]).lock) for r in resources if r["state"] == "RUNNING"]


@pytest.fixture(params=["sqlite", "postgresql"])
def filled(request, home, monkeypatch):
    """A client over the filled store (the home's SQLite file, then PostgreSQL: AIPTRAIN_STORE);
    the RUNNING jobs' locks are held."""
    if request.param == "postgresql":
        monkeypatch.setenv("AIPTRAIN_STORE", request.getfixturevalue("postgres_url"))
    client = Client()
    resources = _fill(client.store)
    locks = _hold_running(client.settings, resources)
    yield client, resources
    for lock in locks:
        lock.release()
    client.close()


def _expected(resources, expression=None, sort_by=None, limit=None):
    expr = filtering.parse(expression) if expression else None
    keys = filtering.parse_sort_keys(sort_by)
    return [r["jobId"] for r in filtering.select(resources, expr, keys, limit, lambda r: r)]


@pytest.mark.parametrize("expression, sort_by, limit", [
    (None, None, None),
    (None, None, 7),
    ("state:FAILED", None, 10),
    ("state:(RUNNING FAILED)", "jobId", 20),
    ("jobId=census_1*", "~jobId", None),
    ("jobId:census* AND state:SUCCEEDED", "~createTime", 5),
    ("createTime>2026-01-05 AND createTime<=2026-01-07T00:00:00Z", "state,~jobId", None),
    ("labels.team=vision AND NOT state:RUNNING", "~labels.n", 4),
    ("census OR labels.n=42", "createTime", None),
    ("state:FAILED", "labels.team,~createTime", 12),
    ("labels.team=ml", None, 9),
    ("labels.team!=ml", "~labels.team,jobId", None),
    ("labels.team=(ml vision) AND state!=RUNNING", "~createTime", 30),
    ("labels.my-key=v*", "~labels.n,state", 8),
    ("labels.team:ML AND jobId=census*", "labels.n", None),
    ("jobId=(mnist_001 census_003 mnist_007)", "labels.n", None),
    (None, "labels.team,~labels.n", 25),
])
def test_list_matches_the_pure_evaluation(filled, expression, sort_by, limit):
    client, resources = filled
    found = [job.job_id for job in client.list(filter=expression, sort_by=sort_by, limit=limit)]
    assert found == _expected(resources, expression, sort_by, limit)
    assert found  # every case selects something


def test_list_default_order_is_newest_first(filled):
    client, _ = filled
    ids = [job.job_id for job in client.list(limit=3)]
    assert ids == [f"{'census' if n % 3 == 0 else 'mnist'}_{n:03d}" for n in (299, 298, 297)]


OLD_SCHEMA = """
CREATE TABLE jobs (job_id TEXT PRIMARY KEY, state TEXT NOT NULL, create_time TEXT NOT NULL,
                   resource TEXT NOT NULL, restarts TEXT NOT NULL DEFAULT '{}');
CREATE TABLE events (job_id TEXT NOT NULL, time TEXT NOT NULL, state TEXT NOT NULL, detail TEXT);
"""


def _old_database(path, resources: list[dict]) -> None:
    """A store as the first releases wrote it: no indexes, no verdicts, no labels column."""
    db = sqlite3.connect(path)
    db.executescript(OLD_SCHEMA)
    db.executemany("INSERT INTO jobs VALUES (?, ?, ?, ?, '{}')",
                   [(r["jobId"], r["state"], r["createTime"], json.dumps(r)) for r in resources])
    db.commit()
    db.close()


def test_existing_databases_get_the_indexes_and_columns(tmp_path):
    path = tmp_path / "old.db"
    _old_database(path, [
        {"jobId": "old", "state": "SUCCEEDED", "createTime": "2025-01-01T00:00:00Z", "labels": {"team": "ml"}},
        {"jobId": "older", "state": "FAILED", "createTime": "2024-01-01T00:00:00Z"},
    ])
    store = JobStore(path)
    indexes = {row[0] for row in store._db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"jobs_by_create_time", "jobs_by_state"} <= indexes
    labels = {job_id: text and json.loads(text) for job_id, text in store._db.execute("SELECT job_id, labels FROM jobs")}
    assert labels == {"old": {"team": "ml"}, "older": None}
    by_state = filtering.plan_query(filtering.parse("state:SUCCEEDED"), (), None)
    assert [r["jobId"] for r in store.resources(by_state)] == ["old"]
    by_label = filtering.plan_query(filtering.parse("labels.team=ml"), (), None)
    assert store.resources(by_label, ["jobId", "state", "createTime", "labels.team"]) == [
        {"jobId": "old", "state": "SUCCEEDED", "createTime": "2025-01-01T00:00:00Z", "labels": {"team": "ml"}}]
    plan = " ".join(str(row) for row in store._db.execute(
        "EXPLAIN QUERY PLAN SELECT resource FROM jobs WHERE state IN ('FAILED') ORDER BY create_time DESC"))
    assert "jobs_by_state" in plan
    store.update_labels("older", lambda labels: {"team": "nlp"})  # the column follows the resource
    assert [r["jobId"] for r in store.resources(filtering.plan_query(filtering.parse("labels.team:nlp"), (), None))] \
        == ["older"]
    store.close()


def test_an_old_store_lists_as_a_new_one(tmp_path, monkeypatch, run):
    """The same jobs in a store written before the labels column and in a new one print the same."""
    old_home, new_home = tmp_path / "old", tmp_path / "new"
    new_store = JobStore(new_home / "jobs.db")
    resources = _fill(new_store)
    new_store.close()
    old_home.mkdir()
    _old_database(old_home / "jobs.db", resources)
    locks = [lock for home in (old_home, new_home) for lock in _hold_running(Settings(home=home), resources)]
    for argv in (["jobs", "list"], ["jobs", "list", "--filter", "labels.team=ml", "--sort-by", "~labels.n"],
                 ["jobs", "list", "--limit", "5", "--format", "value(jobId,labels)"]):
        outputs = []
        for home in (old_home, new_home):
            monkeypatch.setenv("AIPTRAIN_HOME", str(home))
            outputs.append(run(*argv))
        assert outputs[0] == outputs[1] and outputs[0][0] == 0 and outputs[0][1]
    for lock in locks:
        lock.release()


# --- the CLI ------------------------------------------------------------------------------------



def test_list_cli_table_and_formats(filled, run):
    _, resources = filled
    code, out, err = run("jobs", "list", "--filter", "state:FAILED AND jobId:census*", "--sort-by", "jobId",
                         "--limit", "3", "--page-size", "2")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert re.split(r"\s+", lines[0]) == ["JOB_ID", "STATUS", "CREATED"]
    expected = _expected(resources, "state:FAILED AND jobId:census*", "jobId", 3)
    assert [line.split()[0] for line in lines[1:]] == expected
    assert all(line.split()[1] == "FAILED" for line in lines[1:])

    code, out, _ = run("jobs", "list", "--filter", "labels.n=42", "--format", "csv(jobId,state,labels.team)")
    assert list(csv.reader(io.StringIO(out))) == [["job_id", "state", "team"], ["census_042", "CANCELLED", "ml"]]
    code, out, _ = run("jobs", "list", "--filter", "labels.n=(1 2)", "--sort-by", "jobId",
                       "--format", "table[no-heading](jobId, labels.n:label=N)")
    assert out.split() == ["mnist_001", "1", "mnist_002", "2"]
    code, out, _ = run("jobs", "list", "--limit", "2", "--format", "json")
    assert [job["jobId"] for job in json.loads(out)] == _expected(resources, limit=2)
    code, out, _ = run("jobs", "list", "--filter", "jobId=mnist_001", "--format", "value(labels.team,state)")
    assert out == "vision\tFAILED\n"


def test_list_uri_and_nothing_listed(filled, run, monkeypatch):
    code, out, _ = run("jobs", "list", "--filter", "jobId=mnist_001", "--uri")
    assert out == "https://ml.googleapis.com/v1/projects/aiptrain/jobs/mnist_001\n"
    # The jobs are the default project's: job IDs are per project, and another lists none of them.
    assert run("--project", "proj-1", "jobs", "list", "--uri") == (0, "", "Listed 0 items.\n")
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", "from-env")
    assert run("jobs", "list", "--filter", "jobId=mnist_001") == (0, "", "Listed 0 items.\n")
    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT")
    assert "/projects/aiptrain/jobs/" in run("jobs", "list", "--limit", "1", "--uri")[1]
    for extra in ((), ("--format", "value(jobId)"), ("--format", "csv(jobId)"), ("--uri",)):
        assert run("jobs", "list", "--filter", "jobId:nothing*", *extra) == (0, "", "Listed 0 items.\n")
    assert run("jobs", "list", "--filter", "jobId:nothing*", "--format", "json") == (0, "[]\n", "")


@pytest.mark.parametrize("argv, message", [
    (["--filter", "(state:FAILED"], "--filter [(state:FAILED]: a `(` is not closed"),
    (["--sort-by", "~"], "--sort-by [~] is not a field name"),
    (["--limit", "0"], "Invalid value for '--limit'"),
    (["--page-size", "0"], "Invalid value for '--page-size'"),
    (["--format", "table()"], "--format [table()] is not supported here (table needs fields)"),
])
def test_list_refuses_bad_flags(home, run, argv, message):
    code, out, err = run("jobs", "list", *argv)
    assert code == 2 and out == "" and message in err and "Traceback" not in err


# --- jobs update ---------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def labelled(request, home, monkeypatch):
    if request.param == "postgresql":
        monkeypatch.setenv("AIPTRAIN_STORE", request.getfixturevalue("postgres_url"))
    client = Client()
    client.store.create(Job(job_id="lab", labels={"a": "1", "b": "2"}))
    client.store.transition("lab", State.SUCCEEDED, [State.QUEUED])  # finished jobs can be relabelled
    yield client
    client.close()


@pytest.mark.parametrize("argv, labels, message", [
    (["--update-labels", "c=3,a=9"], {"a": "9", "b": "2", "c": "3"}, "Updated ml engine job [lab].\n"),
    (["--remove-labels", "a,zzz"], {"b": "2"}, "Updated ml engine job [lab].\n"),
    (["--clear-labels"], None, "Updated ml engine job [lab].\n"),
    (["--clear-labels", "--update-labels", "x=1"], {"x": "1"}, "Updated ml engine job [lab].\n"),
    (["--update-labels", "a=0", "--remove-labels", "a"], {"b": "2"}, "Updated ml engine job [lab].\n"),
    (["--update-labels", "a=1"], {"a": "1", "b": "2"}, "No update to perform.\n"),
    (["--remove-labels", "zzz"], {"a": "1", "b": "2"}, "No update to perform.\n"),
])
def test_update_labels(labelled, run, argv, labels, message):
    assert run("jobs", "update", "lab", *argv) == (0, "", message)
    job = labelled.store.get("lab")
    assert job.labels == labels and job.state is State.SUCCEEDED
    assert "labels" not in job.to_resource() or labels


@pytest.mark.parametrize("argv, message", [
    ([], "No updates requested."),
    (["--clear-labels", "--remove-labels", "a"], "At most one of --clear-labels | --remove-labels"),
    (["--update-labels", "Bad=1"], "Invalid label key [Bad]"),
    (["--update-labels", "a"], "[a] is not KEY=VALUE"),
])
def test_update_refusals(labelled, run, argv, message):
    code, out, err = run("jobs", "update", "lab", *argv)
    assert code == 2 and message in err
    assert labelled.store.get("lab").labels == {"a": "1", "b": "2"}


def test_update_unknown_job(home, run):
    code, _, err = run("jobs", "update", "nope", "--clear-labels")
    assert code == 2 and "nope" in err


def test_update_labels_api_is_compare_and_set(labelled):
    result = labelled.update_labels("lab", update={"c": "3"}, remove=["a"])
    assert result.changed and result.job.labels == {"b": "2", "c": "3"}
    assert labelled.update_labels("lab", update={"c": "3"}).changed is False
    with pytest.raises(JobNotFound):
        labelled.update_labels("nope", clear=True)


LISTS_WITHOUT_THE_MODEL = """
import sys
from aiptrain.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit_:
    assert exit_.code == 0, exit_.code
heavy = sorted(m for m in ("pydantic", "aiptrain.model", "aiptrain.client", "docker", "yaml") if m in sys.modules)
print("imported:", heavy, file=sys.stderr)
"""


@pytest.mark.parametrize("argv", [
    ["jobs", "list", "--limit", "20"],
    ["jobs", "list", "--filter", "labels.team=ml AND state!=RUNNING", "--sort-by", "~labels.n"],
    ["jobs", "list", "--format", "value(jobId,labels.team)"],
])
def test_a_table_of_jobs_needs_neither_pydantic_nor_the_engine(filled, argv):
    """The start-up cost of `jobs list` stays near click's: a fresh process imports no heavy module."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", LISTS_WITHOUT_THE_MODEL, *argv], capture_output=True, text=True)
    assert result.stdout and result.stderr.splitlines()[-1] == "imported: []", result.stderr


def test_listing_starts_the_homes_controller_only_while_jobs_are_active(home):
    """A controller that died is replaced by the next command that sees active jobs: listing too."""
    from aiptrain.runner import control

    client = Client()
    for n in range(3):
        client.store.create(Job(job_id=f"ended_{n}"))
        client.store.transition(f"ended_{n}", State.SUCCEEDED, [State.QUEUED])
    assert len(listing.list_resources(client.settings, fields=["jobId"])) == 3
    assert control.running(client.settings) is None
    client.store.create(Job(job_id="active"))
    lock = JobLock.try_acquire(client.settings.job_paths("active").lock)  # its submit is still at work
    assert len(listing.list_resources(client.settings, "state:QUEUED", fields=["jobId"])) == 1
    assert control.running(client.settings) is not None
    lock.release()
    client.close()


@pytest.mark.parametrize("argv", [
    ["--help"], ["jobs", "--help"], ["jobs", "submit", "training", "--help"], ["local", "train", "--help"],
    ["--version"],
])
def test_help_imports_no_heavy_module(home, argv):
    """Why aiptrain imports inside functions (docs/development.md, "Imports"): `aiptrain --help`
    and every command's help cost about what click costs, so none of them may load pydantic,
    the engine's SDK or YAML."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", LISTS_WITHOUT_THE_MODEL, *argv], capture_output=True, text=True)
    assert result.stdout and result.stderr.splitlines()[-1] == "imported: []", result.stderr

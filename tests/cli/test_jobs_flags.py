"""The table (docs/reference/flags.md) of the flags of list, describe, update, cancel, stream-logs and
export: each flag exists, each row names a test that exists, and the rows not covered elsewhere are tested here
(on jobs put straight into an isolated store: no Docker)."""

from __future__ import annotations

import ast
import json
import re

import pytest
import yaml

from aiptrain.client import Client
from aiptrain.logs import JobLogWriter
from aiptrain.model import Job, State

from conftest import REPO

COMMANDS = ("list", "describe", "update", "cancel", "stream-logs", "export")


def reference_rows() -> list[tuple[str, str, str]]:
    text = (REPO / "docs" / "reference" / "flags.md").read_text()
    section = text.split("## Flags of `list`, `describe`, `update`, `cancel`, `stream-logs` and `export`")[1]
    section = section.split("\n## ")[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in COMMANDS:
            rows.append((cells[0], cells[1], cells[3]))
    return rows


def test_every_row_names_a_real_flag_and_a_real_test(run):
    rows = reference_rows()
    assert {command for command, _, _ in rows} == set(COMMANDS)
    for command, flag, tests in rows:
        name = re.match(r"`(--[a-z-]+)", flag)
        if name and "gcloud-wide" not in flag:
            code, out, _ = run("jobs", command, "--help")
            assert code == 0 and name.group(1) in out, (command, flag)
        module = None
        for reference in tests.split(", "):
            if "::" in reference:
                module, reference = reference.split("::")
            functions = {node.name for node in ast.walk(ast.parse((REPO / "tests" / module).read_text()))
                         if isinstance(node, ast.FunctionDef)}
            assert reference in functions, (command, flag, module, reference)



@pytest.fixture
def ended(home):
    """A FAILED job with a two-line message from each of two replicas."""
    with Client() as client:
        client.store.create(Job(job_id="ended", labels={"a": "1"}))
        with JobLogWriter(client.settings.job_paths("ended").log) as log:
            log.write("master-replica-0", "INFO", "first\nsecond")
            log.write("worker-replica-0", "ERROR", "boom\nagain")
        client.store.transition("ended", State.FAILED, [State.QUEUED], error_message="It failed.\nTail.")
    return "ended"


def test_describe_flags(ended, run):
    code, out, err = run("jobs", "describe", ended)
    assert code == 0 and yaml.safe_load(out)["state"] == "FAILED"
    assert "errorMessage: |-\n  It failed.\n  Tail.\n" in out  # a block literal a person can read
    assert yaml.safe_load(run("jobs", "describe", ended, "--format", "yaml(errorMessage)")[1]) == {
        "errorMessage": "It failed.\nTail."}
    assert "aiptrain jobs stream-logs ended" in err
    assert json.loads(run("jobs", "describe", ended, "--format", "json")[1])["labels"] == {"a": "1"}
    assert run("jobs", "describe", ended, "--format", "value(state,errorMessage)")[1] == "FAILED\tIt failed.\nTail.\n"
    assert run("jobs", "describe", ended, "--format", "csv[no-heading](jobId,state)")[1] == "ended,FAILED\n"
    code, out, err = run("jobs", "describe", ended, "--summarize", "--format", "json")
    assert code == 0 and "Job Overview" in out and "--format is ignored when --summarize is present" in err
    code, _, err = run("jobs", "describe", "absent")
    assert code == 2 and "absent" in err


def test_cancel_flags(ended, run):
    assert run("jobs", "cancel", ended)[:2] == (0, "")  # already ended: left as it is, silently
    with Client() as client:
        assert client.get(ended).state is State.FAILED
    code, _, err = run("jobs", "cancel", "absent")
    assert code == 2 and "absent" in err


def test_stream_logs_flags(ended, run):
    code, out, _ = run("jobs", "stream-logs", ended)
    assert code == 0 and [line.split("\t")[4] for line in out.splitlines()] == ["first", "second", "boom", "again"]
    out = run("jobs", "stream-logs", ended, "--task-name", "worker-replica-0")[1]
    assert [line.split("\t")[2] for line in out.splitlines()] == ["worker-replica-0"] * 2
    out = run("jobs", "stream-logs", ended, "--allow-multiline-logs")[1]
    assert out.count("\tmaster-replica-0\t") == 1 and "\t\tfirst\nsecond\n" in out
    assert run("jobs", "stream-logs", ended, "--polling-interval", "5")[0] == 0
    code, _, err = run("jobs", "stream-logs", ended, "--polling-interval", "0")
    assert code == 2 and "--polling-interval" in err


def test_each_project_sees_its_own_job_of_one_id(home, run, monkeypatch):
    """Job IDs are unique per project: `--project` (else core/project) picks whose `census_1`
    describe, list, stream-logs, update and cancel find, in local mode as through the API."""
    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT", raising=False)
    for project, state in (("team-a", State.SUCCEEDED), ("team-b", State.FAILED)):
        with Client(project=project) as client:
            client.store.create(Job(job_id="census_1", labels={"team": project}), project=project)
            key = client.key("census_1")
            with JobLogWriter(client.settings.job_paths(key).log) as log:
                log.write("master-replica-0", "INFO", f"{project} says")
            client.store.transition(key, state, [State.QUEUED])
    for project, state in (("team-a", "SUCCEEDED"), ("team-b", "FAILED")):
        code, out, _ = run("--project", project, "jobs", "describe", "census_1", "--format", "json")
        assert code == 0 and (json.loads(out)["labels"], json.loads(out)["state"]) == ({"team": project}, state)
        assert run("--project", project, "jobs", "list", "--format", "value(jobId,labels.team)")[1] == \
            f"census_1\t{project}\n"
        out = run("--project", project, "jobs", "stream-logs", "census_1")[1]
        assert [line.split("\t")[4] for line in out.splitlines()] == [f"{project} says"]
        assert run("--project", project, "jobs", "cancel", "census_1")[:2] == (0, "")  # its own, which ended
    assert run("--project", "team-b", "jobs", "update", "census_1", "--update-labels", "team=bee")[0] == 0
    assert Client(project="team-a").get("census_1").labels == {"team": "team-a"}
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", "team-b")  # core/project, as gcloud reads it
    assert json.loads(run("jobs", "describe", "census_1", "--format", "json")[1])["labels"] == {"team": "bee"}
    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT")
    code, _, err = run("jobs", "describe", "census_1")  # the default project, `aiptrain`, has none
    assert code == 2 and "census_1" in err and "team-" not in err
    assert run("jobs", "list") == (0, "", "Listed 0 items.\n")

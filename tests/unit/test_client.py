"""aiptrain.Client, the Python API: pure checks, then submit/wait/stream_logs/cancel on the real
engine with the minimal runtime and the basic sample."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import aiptrain
from aiptrain.client import Client
from aiptrain.errors import JobNotFound, ValidationError
from aiptrain.model import Job
from aiptrain.service import LabelsUpdate

from conftest import SAMPLE_TRAINER


def test_import_aiptrain_stays_light():
    code = "import sys, aiptrain; print('aiptrain.client' in sys.modules, 'pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
    assert aiptrain.Client is Client
    with pytest.raises(AttributeError):
        aiptrain.Nope  # noqa: B018


def test_client_reads_its_own_home(tmp_path, home):
    with Client(home=tmp_path / "elsewhere") as client:
        assert client.settings.home == (tmp_path / "elsewhere").resolve()
        client.store.create(Job(job_id="there"))
        assert [job.job_id for job in client.list()] == ["there"]
        assert client.job_ids("th") == ["there"] and client.job_ids("x") == []
    assert "store" not in client.__dict__  # closed
    with Client() as default:  # AIPTRAIN_HOME
        assert default.list() == []
        with pytest.raises(JobNotFound, match=r"\[there\]"):
            default.get("there")


def test_update_labels_returns_the_job(home):
    with Client() as client:
        client.store.create(Job(job_id="j", labels={"a": "1"}))
        result = client.update_labels("j", update={"b": "2"})
        assert result == LabelsUpdate(client.get("j"), True)
        assert result.job.labels == {"a": "1", "b": "2"}
        with pytest.raises(ValidationError, match="Invalid label key"):
            client.update_labels("j", update={"B": "x"})


def test_update_labels_of_a_job_deleted_meanwhile_is_not_found(home, monkeypatch):
    with Client() as client:
        client.store.create(Job(job_id="j", labels={"a": "1"}))
        found = client.key("j")

        def found_then_deleted(job_id: str) -> str:  # another process deletes it after the check
            client.store.delete(found)
            return found

        monkeypatch.setattr(client, "key", found_then_deleted)
        with pytest.raises(JobNotFound):
            client.update_labels("j", update={"b": "2"})


@pytest.mark.parametrize("kwargs, message", [
    ({"scale_teir": "basic"}, "unknown flag(s) scale_teir"),
    ({"module_name": None}, "--module-name is required"),
    ({"labels": {"Bad": "x"}}, "Invalid label key [Bad]"),
])
def test_submit_training_refuses_bad_input_and_creates_nothing(home, kwargs, message):
    with Client() as client:
        arguments = {"package_path": SAMPLE_TRAINER, "module_name": "trainer.task", **kwargs}
        with pytest.raises(ValidationError, match=re.escape(message)):
            client.submit_training("refused", **arguments)
        assert client.list() == []


def test_uri_names_the_project(home, monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", "p-env")
    with Client() as client:
        assert client.uri("j") == "https://ml.googleapis.com/v1/projects/p-env/jobs/j"
        assert client.uri("j", "p-flag").endswith("/projects/p-flag/jobs/j")



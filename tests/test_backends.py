"""The backend seam: which backend a job gets, and that every job verb goes to it."""

import sqlite3

import pytest
from conftest import drive_to_end

import aiptrain
import aiptrain.backends
import aiptrain.client
from aiptrain.backends import ReplicaObservation, ReplicaStatus, open_backend
from aiptrain.backends.docker import DockerBackend
from aiptrain.errors import ValidationError
from aiptrain.model import Job
from aiptrain.settings import Settings
from aiptrain.store import JobStore


def test_open_backend_builds_the_named_one_and_defaults_to_aiptrain_backend(home, monkeypatch):
    assert isinstance(open_backend(Settings()), DockerBackend)
    assert isinstance(open_backend(Settings(), "docker"), DockerBackend)
    monkeypatch.setenv("AIPTRAIN_BACKEND", "docker")
    assert Settings().backend == "docker"


def test_an_unknown_aiptrain_backend_is_one_line(home, monkeypatch):
    monkeypatch.setenv("AIPTRAIN_BACKEND", "kubernetes")
    with pytest.raises(ValidationError, match=r"AIPTRAIN_BACKEND \[kubernetes\] is not a backend: set it to one of docker, swarm"):
        Settings()


def test_an_unknown_backend_flag_is_a_usage_error(run):
    code, out, err = run("jobs", "submit", "training", "j", "--backend", "k8s", "--module-name", "m")
    assert code == 2 and "'k8s' is not one of 'docker', 'swarm'" in err and not out


def test_the_store_records_each_jobs_backend(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    store.create(Job(job_id="a"))
    store.create(Job(job_id="b"), backend="swarm")
    assert (store.backend_of("a"), store.backend_of("b"), store.backend_of("unknown")) == ("docker", "swarm", "docker")


def test_a_store_made_before_backends_takes_the_column_on_open(tmp_path):
    path = tmp_path / "jobs.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE jobs (job_id TEXT PRIMARY KEY, state TEXT NOT NULL, create_time TEXT NOT NULL,
                           resource TEXT NOT NULL, restarts TEXT NOT NULL DEFAULT '{}');
        CREATE TABLE events (job_id TEXT NOT NULL, time TEXT NOT NULL, state TEXT NOT NULL, detail TEXT);
        INSERT INTO jobs VALUES ('old', 'SUCCEEDED', '2026-01-01T00:00:00Z', '{"jobId": "old", "state": "SUCCEEDED"}', '{}');
    """)
    db.close()
    store = JobStore(path)
    assert store.backend_of("old") == "docker" and store.get("old").job_id == "old"
    store.create(Job(job_id="new"), backend="swarm")
    assert JobStore(path).backend_of("new") == "swarm"


class RecordingBackend:
    """A backend typed as the protocol that records what the job verbs ask of it."""

    name = "recording"

    def __init__(self):
        self.calls = []

    def observe(self, job_id):
        self.calls.append(("observe", job_id))
        return [ReplicaObservation("master-replica-0", "master", 0, ReplicaStatus.RUNNING, container_id="c1")]

    def stop(self, container_ids, grace_seconds=10):
        self.calls.append(("stop", tuple(container_ids)))

    def remove(self, job_id, trial_id=None):
        self.calls.append(("remove", job_id))

    def watch(self, stop, on_change):
        self.calls.append(("watch",))


def test_the_client_sends_each_job_to_the_backend_it_records(home, monkeypatch):
    opened = []
    monkeypatch.setattr(aiptrain.client, "open_backend",
                        lambda settings, name: opened.append(name) or RecordingBackend())
    with aiptrain.Client() as client:
        client.store.create(Job(job_id="on_swarm"), backend="swarm")
        client.store.create(Job(job_id="on_docker"))
        assert client.replicas("on_swarm")[0].status is ReplicaStatus.RUNNING
        client.replicas("on_docker")
        client.replicas("on_swarm")
    assert opened == ["swarm", "docker"]  # each opened once per client


def test_an_interrupted_submission_is_failed_and_its_remains_removed(home):
    """Recorded QUEUED, never queued for admission, its lock free: its submit died."""
    from aiptrain.model import State
    from aiptrain.runner.driver import INTERRUPTED, JobDriver

    settings = Settings()
    settings.ensure_dirs()
    store = JobStore(settings.store_path)
    store.create(Job(job_id="interrupted"), backend="swarm")
    backend = RecordingBackend()
    assert drive_to_end(JobDriver("interrupted", settings, store, backend)) is State.FAILED
    assert store.get("interrupted").error_message.startswith(INTERRUPTED)
    assert backend.calls[-1] == ("remove", "interrupted")


def _protocol_members():
    from aiptrain.backends import Backend

    return sorted(name for name in vars(Backend) if not name.startswith("_")) + ["name", "from_settings"]


@pytest.mark.parametrize("backend_name", sorted(aiptrain.backends._BACKEND_CLASSES))
def test_every_backend_implements_the_whole_protocol_with_its_signatures(backend_name):
    import importlib
    import inspect

    from aiptrain.backends import Backend

    module, class_name = aiptrain.backends._BACKEND_CLASSES[backend_name]
    backend_class = getattr(importlib.import_module(module), class_name)
    assert backend_class.name == backend_name
    for member in _protocol_members():
        assert hasattr(backend_class, member), f"{class_name} lacks {member}"
        if callable(getattr(Backend, member, None)):
            expected = list(inspect.signature(getattr(Backend, member)).parameters)
            assert list(inspect.signature(getattr(backend_class, member)).parameters) == expected, member


def test_the_controller_drives_each_job_on_the_backend_it_records(home, monkeypatch):
    """One controller drives every job of the home: each through the backend its job records,
    each backend opened once (with one engine event watcher)."""
    from aiptrain.ownership import JobLock
    from aiptrain.runner.controller import Controller

    settings = Settings()
    settings.ensure_dirs()
    store = JobStore(settings.store_path)
    store.create(Job(job_id="on_swarm"), backend="swarm")
    store.create(Job(job_id="on_docker"))
    store.create(Job(job_id="on_swarm_too"), backend="swarm")
    opened = []
    monkeypatch.setattr("aiptrain.runner.controller.open_backend",
                        lambda s, name: opened.append(name) or RecordingBackend())
    controller = Controller(settings, JobLock.try_acquire(settings.controller_lock_path))
    assert controller.adopt() is False
    assert sorted(opened) == ["docker", "swarm"]
    assert {job_id: d.backend is controller.backends[store.backend_of(job_id)]
            for job_id, d in controller.drivers.items()} == dict.fromkeys(["on_swarm", "on_docker", "on_swarm_too"], True)
    assert not list(settings.locks_dir.glob("*.lock"))  # adopted: the controller's lock covers them
    controller.shut_down()

"""The backend seam: which backend a job gets, and that every job verb goes to it."""

import sqlite3

import pytest

import aiptrain
import aiptrain.backends
import aiptrain.client
from aiptrain.backends import ReplicaStatus, open_backend
from aiptrain.backends.docker import DockerBackend
from aiptrain.errors import ValidationError
from aiptrain.logs import parse_engine_time
from aiptrain.model import Job
from aiptrain.settings import Settings
from aiptrain.store import JobStore

from conftest import drive_to_end
from fakes import FakeBackend, FakeInstallation, plan_of


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


def test_the_client_sends_each_job_to_the_backend_it_records(home, monkeypatch):
    opened = []
    backends = {name: FakeBackend(name=name) for name in ("swarm", "docker")}
    backends["swarm"].launch(plan_of("on_swarm"))
    monkeypatch.setattr(aiptrain.client, "open_backend", lambda settings, name: opened.append(name) or backends[name])
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
    backend = FakeBackend()
    assert drive_to_end(JobDriver("interrupted", settings, store, backend)) is State.FAILED
    assert store.get("interrupted").error_message.startswith(INTERRUPTED)
    assert backend.removed[-1] == ("interrupted", None)


def _protocol_members():
    from aiptrain.backends import Backend

    return sorted(name for name in vars(Backend) if not name.startswith("_")) + ["name", "from_settings"]


def _backend_class(backend_name: str):
    import importlib

    if backend_name == "fake":
        return FakeBackend
    module, class_name = aiptrain.backends._BACKEND_CLASSES[backend_name]
    return getattr(importlib.import_module(module), class_name)


@pytest.mark.parametrize("backend_name", [*sorted(aiptrain.backends._BACKEND_CLASSES), "fake"])
def test_every_backend_implements_the_whole_protocol_with_its_signatures(backend_name):
    """The real backends, and the tests' fake (tests/fakes.py), which must not drift from them."""
    import inspect

    from aiptrain.backends import Backend

    backend_class = _backend_class(backend_name)
    class_name = backend_class.__name__
    assert backend_class.name == backend_name
    for member in _protocol_members():
        assert hasattr(backend_class, member), f"{class_name} lacks {member}"
        if callable(getattr(Backend, member, None)):
            expected = list(inspect.signature(getattr(Backend, member)).parameters)
            assert list(inspect.signature(getattr(backend_class, member)).parameters) == expected, member


def _installation_class(backend_name: str):
    if backend_name == "fake":
        return FakeInstallation
    return type(_backend_class(backend_name)().installation)


@pytest.mark.parametrize("backend_name", [*sorted(aiptrain.backends._BACKEND_CLASSES), "fake"])
def test_every_installation_implements_the_whole_protocol_with_its_signatures(backend_name):
    """What the home's jobs share (the controller's, aiptrain.backends.Installation), beside each backend."""
    import inspect

    from aiptrain.backends import Installation

    installation_class = _installation_class(backend_name)
    for member in sorted(name for name in vars(Installation) if not name.startswith("_")):
        assert hasattr(installation_class, member), f"{installation_class.__name__} lacks {member}"
        expected = list(inspect.signature(getattr(Installation, member)).parameters)
        assert list(inspect.signature(getattr(installation_class, member)).parameters) == expected, member


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
                        lambda s, name: opened.append(name) or FakeBackend(name=name))
    controller = Controller(settings, JobLock.try_acquire(settings.controller_lock_path))
    assert controller.adopt() is False
    assert sorted(opened) == ["docker", "swarm"]
    assert {job_id: d.backend is controller.backends[store.backend_of(job_id)]
            for job_id, d in controller.drivers.items()} == dict.fromkeys(["on_swarm", "on_docker", "on_swarm_too"], True)
    assert not list(settings.locks_dir.glob("*.lock"))  # adopted: the controller's lock covers them
    controller.shut_down()


def test_the_fake_backend_plays_its_script_and_reports_each_change():
    """tests/fakes.py: replicas exit as scripted on the test's steps, restart in place, and every
    change reaches the watchers."""
    import threading

    backend = FakeBackend(script={"master-replica-0": [137, 0]}, logs={"master-replica-0": ["hello"]})
    stop, changes = threading.Event(), []
    watcher = threading.Thread(target=backend.watch, args=(stop, changes.append))
    watcher.start()
    assert backend.watching.wait(timeout=60)  # registered before the first change
    backend.launch(plan_of("job", "master-replica-0", "worker-replica-0"))
    master = backend.container_id("job", "master-replica-0")
    backend.advance()
    states = {o.task_name: (o.status, o.exit_code) for o in backend.observe("job")}
    assert states == {"master-replica-0": (ReplicaStatus.EXITED, 137), "worker-replica-0": (ReplicaStatus.RUNNING, None)}
    assert [line.text for batch in backend.follow_logs(master) for line in batch] == ["hello"]
    first_run = [chunk.time for batch in backend.follow_logs(master) for chunk in batch]
    backend.restart(master)
    backend.advance()
    assert backend.replica("job", "master-replica-0").exit_code == 0
    assert list(backend.follow_logs(master, parse_engine_time(first_run[-1])))  # the second run's line is new
    backend.stop([backend.container_id("job", "worker-replica-0")])
    assert {o.exit_code for o in backend.observe("job")} == {0, 143}
    backend.remove("job")
    assert backend.observe("job") == [] and backend.restarted == [master] and backend.removed == [("job", None)]
    stop.set()
    watcher.join(timeout=60)
    assert changes == ["job"] * 6  # launch, exit, restart, exit, stop, remove


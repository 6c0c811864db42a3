"""A submit asks each question once (docs/design/controller.md's habit, TorchX's `run = dryrun +
schedule`): one reservation of the job's ID (its lock, then its row), one inspection of the
runtime image (its freshness, its contents, the readiness check and the install's key all read
that one answer), one fetch of the packages, one plan. Counted on the fake backend, through the
whole `Client.submit`, with the controller driving the job in a thread of the test."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from aiptrain import staging, submission
from aiptrain.backends import Backend, ImageInfo
from aiptrain.client import Client
from aiptrain.config import SubmitFlags
from aiptrain.errors import JobExists
from aiptrain.model import State
from aiptrain.ownership import JobLock
from aiptrain.runtimes import RECIPE_LABEL, lookup, recipe
from aiptrain.settings import Settings
from aiptrain.store import JobStore

from fakes import FakeBackend


@dataclass
class Questions:
    """What the submitting thread asked (the controller's own questions, in its thread, are its
    business): by question, how many times."""

    asked: dict[str, int] = field(default_factory=dict)

    def count(self, name: str, function, about=lambda *args: True):
        """`function`, counted where the submitting thread calls it about what `about` accepts."""
        submitting = threading.get_ident()

        def counted(*args, **kwargs):
            if threading.get_ident() == submitting and about(*args):
                self.asked[name] = self.asked.get(name, 0) + 1
            return function(*args, **kwargs)

        return counted


@pytest.fixture
def questions(monkeypatch, settings) -> Questions:
    asked = Questions()
    monkeypatch.setattr(JobStore, "exists", asked.count("job exists?", JobStore.exists))
    monkeypatch.setattr(JobStore, "create", asked.count("job recorded", JobStore.create))
    job_lock = staticmethod(asked.count("job locked", JobLock.try_acquire,
                                         lambda path: path == settings.job_paths("job").lock))
    monkeypatch.setattr(JobLock, "try_acquire", job_lock)
    monkeypatch.setattr(staging, "fetch", asked.count("fetch", staging.fetch))
    monkeypatch.setattr(submission, "plan", asked.count("plan", submission.plan))
    return asked


@pytest.fixture
def settings(tmp_path) -> Settings:
    settings = Settings(home=tmp_path / "home", poll_seconds=0.01)
    settings.ensure_dirs()
    return settings


def current_runtime_image(settings: Settings, version: str = "minimal") -> tuple[str, ImageInfo]:
    """The runtime's image as this aiptrain would have built it: current, so nothing is built."""
    rt = lookup(version, settings.home)
    return rt.image, ImageInfo("sha256:" + "1" * 64, {RECIPE_LABEL: recipe(rt)})


def trainer(tmp_path):
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text("")
    (tmp_path / "trainer" / "task.py").write_text("print('hi')\n")
    return str(tmp_path / "trainer")


@pytest.mark.parametrize("installs_once", [True, False], ids=["installed-once", "installed-per-replica"])
def test_a_submit_asks_each_question_once(settings, tmp_path, questions, controller_in_process, installs_once):
    """With the install-once step (one engine: the packages are installed for every replica at
    submit) and without it (the replicas install them, as on a swarm), the same questions."""
    image, info = current_runtime_image(settings)
    backend = FakeBackend(images={image: info}, host_dirs_reach_replicas=installs_once)
    fake: Backend = backend  # the fake is typed as the protocol it stands for
    controller_in_process(settings, fake)
    with Client(settings=settings, backend=fake) as client:
        job = client.submit(client.prepare(SubmitFlags(
            job_id="job", package_path=trainer(tmp_path), module_name="trainer.task", region="us-central1",
            runtime_version="minimal")))
    assert job.state is State.RUNNING
    assert questions.asked == {"job locked": 1, "job recorded": 1, "fetch": 1, "plan": 1}
    assert backend.calls_to("inspect_image") == [("inspect_image", image)]
    assert backend.calls_to("check_ready") == [("check_ready", "job", (image,))]  # the inspection, reused
    installs = settings.cache_dir / "installs"
    mounted = [m for m in backend.launched[0].containers[0].mounts if Path(m.source).is_relative_to(installs)]
    assert bool(mounted) is installs_once


def test_a_custom_container_inspects_nothing_at_submit(settings, questions, controller_in_process):
    """Its image is the readiness check's to find (a registry's, on every node of a swarm)."""
    backend = FakeBackend()
    controller_in_process(settings, backend)
    with Client(settings=settings, backend=backend) as client:
        client.submit(client.prepare(SubmitFlags(job_id="job", region="us-central1",
                                                 master_image_uri="example.com/trainer:1")))
    assert questions.asked == {"job locked": 1, "job recorded": 1, "fetch": 1, "plan": 1}
    assert backend.calls_to("inspect_image") == []
    assert backend.calls_to("check_ready") == [("check_ready", "job", ())]


def test_a_taken_id_is_refused_by_the_one_reservation_before_anything_else(settings, tmp_path, questions,
                                                                          controller_in_process):
    image, info = current_runtime_image(settings)
    backend = FakeBackend(images={image: info})
    controller_in_process(settings, backend)
    flags = SubmitFlags(job_id="job", package_path=trainer(tmp_path), module_name="trainer.task",
                        region="us-central1", runtime_version="minimal")
    with Client(settings=settings, backend=backend) as client:
        client.submit(client.prepare(flags))
        questions.asked.clear()
        backend.calls.clear()
        with pytest.raises(JobExists):
            client.submit(client.prepare(flags))
    assert questions.asked == {"job locked": 1, "job recorded": 1}
    # No image looked at, nothing installed or checked (the controller drives the first job meanwhile).
    assert [call for call in backend.calls if call[0] in ("inspect_image", "run_to_completion", "check_ready")] == []
    assert settings.job_paths("job").lock.exists()  # the lock of the job that has the ID stays its own

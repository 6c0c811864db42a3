"""Job locks and files around real submissions: a refused or failed submit leaves no lock, a
finished job leaves no lock or work dir, a submit that died before queueing is failed by the
controller."""

from __future__ import annotations

import uuid

import pytest
import yaml

from aiptrain.ownership import JobLock

from conftest import REPO, job_resources
from fakes import FakeBackend


def test_a_rejected_submit_leaves_no_lock_file(cli, home, tmp_path):
    root = tmp_path / "broken"
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "__init__.py").write_text("")
    (root / "setup.py").write_text("raise SystemExit('error: setup.py is broken')\n")
    result = cli("jobs", "submit", "training", "rejected", "--package-path", str(root / "trainer"),
                 "--module-name", "trainer.task", "--region", "us-central1", "--runtime-version", "minimal")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("ERROR: Packaging of user Python code failed: error: setup.py is broken. Try ")
    assert len(result.stderr.splitlines()) == 1, result.stderr  # one line; --verbosity info shows the build's output
    assert not any((home / "locks").iterdir())
    assert not (home / "work").exists() or not any((home / "work").iterdir())


def test_a_failed_launch_is_submits_error_and_leaves_neither_packages_nor_lock(home, tmp_path,
                                                                               controller_in_process):
    """The controller launches; a launch the engine refuses fails the job, and submit, which waits
    for the launch, says why (exit 3) as when it launched itself."""
    from aiptrain.config import SubmitFlags
    from aiptrain.errors import AiptrainError, EnvironmentNotReady
    from aiptrain.settings import Settings
    from aiptrain.store import JobStore
    from aiptrain.submission import Submitter, prepare

    settings = Settings()
    settings.ensure_dirs()
    store = JobStore(settings.store_path)
    flags = SubmitFlags(job_id="launch_fails", package_path=str(REPO / "sample_jobs" / "basic" / "trainer"),
                        module_name="trainer.task", region="us-central1", runtime_version="minimal",
                        job_dir=str(tmp_path / "out"))
    failing_launch = FakeBackend(name="docker", fail={"launch": AiptrainError("The engine refused to start the replicas.")})
    controller_in_process(settings, failing_launch)
    with pytest.raises(EnvironmentNotReady, match="refused"):
        # The launch fails after the submission was staged and planned (the install "succeeds").
        Submitter(settings, store, failing_launch).submit(prepare(flags, settings))
    assert store.get("launch_fails").state.value == "FAILED"  # recorded: replicas were to start
    assert not settings.job_paths("launch_fails").work_dir.exists()
    assert not settings.job_paths("launch_fails").lock.exists()


def test_a_finished_job_leaves_no_lock_work_dir_or_other_log(cli, home, docker_api, submit_args):
    job_id = f"tidy_{uuid.uuid4().hex[:8]}"
    cli(*submit_args(job_id, "--stream-logs"), check_code=0)
    assert yaml.safe_load(cli("jobs", "describe", job_id, check_code=0).stdout)["state"] == "SUCCEEDED"
    assert sorted(p.name for p in (home / "logs").iterdir()) == [f"{job_id}.jsonl"]
    assert not any((home / "locks").iterdir())
    assert not any((home / "work").iterdir())
    assert job_resources(docker_api, job_id) == []


def test_a_job_whose_submit_died_before_queueing_it_is_failed_by_the_controller(cli, home, docker_api):
    """Recorded, never queued, its lock free: the controller fails it, and nothing is left behind."""
    from aiptrain.model import Job
    from aiptrain.settings import Settings
    from aiptrain.store import JobStore

    from conftest import wait_for

    settings = Settings()
    settings.ensure_dirs()
    job_id = f"killed_{uuid.uuid4().hex[:8]}"
    with JobStore(settings.store_path) as store:
        store.create(Job.model_validate({"jobId": job_id}))
    lock = JobLock.try_acquire(settings.job_paths(job_id).lock)
    lock.release()  # its submit died
    job = wait_for(lambda: (j := yaml.safe_load(cli("jobs", "describe", job_id, check_code=0).stdout))["state"]
                   == "FAILED" and j, timeout=30, what="the job failed")
    assert "interrupted" in job["errorMessage"]
    assert sorted(p.name for p in (home / "logs").iterdir()) == [f"{job_id}.jsonl"]
    assert not any((home / "locks").iterdir())


def test_a_failed_launch_says_its_own_error_when_the_engine_keeps_some_of_it(docker_api, monkeypatch):
    """The launch's undoing meets a network the engine keeps (Docker's stale endpoint): the job's
    error is still why the launch failed; the leftover is a warning in the controller's log."""
    from types import SimpleNamespace

    from aiptrain.backends.engine import removed_on_failure
    from aiptrain.errors import AiptrainError

    def keeps_the_network(job_id, trial_id=None):
        raise AiptrainError("Docker keeps the job's network 0123456789ab although its replicas are gone")

    with pytest.raises(AiptrainError, match="^The engine refused to start the replicas"), \
            removed_on_failure(SimpleNamespace(job_id="launch_fails", trial_id=None), keeps_the_network):
        raise AiptrainError("The engine refused to start the replicas.")

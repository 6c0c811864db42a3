"""Edges found by using the tool as a user would (issue 12, items 7, 9, 10, 12): files left
behind, a job dir inside aiptrain's home, raw bytes on a terminal, and evaluators that
lose their last evaluation."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from aiptrain import cache
from aiptrain.backends import ReplicaObservation, ReplicaStatus
from aiptrain.lifecycle import awaited_at_end
from aiptrain.logs import printable
from aiptrain.ownership import JobLock, remove_if_unowned
from aiptrain.topology import parse_task_name

from conftest import REPO, job_resources, require_image
from fakes import FakeBackend

PROBE = REPO / "tests" / "trainers" / "probe"


# -- who waits at the end of a group (pure) ---------------------------------------------------


def obs(task: str, status: str, code: int | None = None) -> ReplicaObservation:
    task_type, index = parse_task_name(task)
    return ReplicaObservation(task, task_type, index, status, code, datetime.now(timezone.utc),
                              container_id=task)


@pytest.mark.parametrize(
    "observations, cancelling, awaited",
    [
        ([obs("master-replica-0", ReplicaStatus.EXITED, 0), obs("evaluator-replica-0", ReplicaStatus.RUNNING)], False, ["evaluator-replica-0"]),
        ([obs("master-replica-0", ReplicaStatus.EXITED, 0), obs("evaluator-replica-0", ReplicaStatus.RUNNING),
          obs("evaluator-replica-1", ReplicaStatus.EXITED, 0), obs("worker-replica-0", ReplicaStatus.RUNNING), obs("ps-replica-0", ReplicaStatus.RUNNING)],
         False, ["evaluator-replica-0"]),
        ([obs("master-replica-0", ReplicaStatus.EXITED, 0), obs("evaluator-replica-0", ReplicaStatus.RUNNING)], True, []),  # cancelled
        ([obs("master-replica-0", ReplicaStatus.EXITED, 1), obs("evaluator-replica-0", ReplicaStatus.RUNNING)], False, []),  # master failed
        ([obs("master-replica-0", ReplicaStatus.RUNNING), obs("evaluator-replica-0", ReplicaStatus.RUNNING)], False, []),  # still training
        ([obs("master-replica-0", ReplicaStatus.EXITED, 0), obs("worker-replica-0", ReplicaStatus.RUNNING)], False, []),  # no evaluator
    ],
)
def test_only_evaluators_of_a_successful_master_are_awaited(observations, cancelling, awaited):
    assert [o.task_name for o in awaited_at_end(observations, cancelling)] == awaited


# -- cache pruning (pure) ---------------------------------------------------------------------

DAY = 86400.0
NOW = 100 * DAY


def entry(name: str, days_idle: float, mib: int, partial: bool = False) -> cache.Entry:
    return cache.Entry(Path(name), NOW - days_idle * DAY, mib * 2**20, partial)


@pytest.mark.parametrize(
    "found, max_age_days, max_mib, removed",
    [
        ([entry("old", 40, 1), entry("fresh", 1, 1)], 30, 100, ["old"]),
        # over the size limit: least recently used first, until it fits
        ([entry("a", 5, 40), entry("b", 3, 40), entry("c", 1, 40)], 30, 50, ["a", "b"]),
        # used within the hour: kept whatever the limits
        ([entry("busy", 0.01, 500)], 0, 0, []),
        # a half-built entry goes once it is an hour old, however young the age limit says
        ([entry(".partial", 0.5, 1, partial=True), entry(".new", 0.01, 1, partial=True)], 30, 100, [".partial"]),
        ([], 30, 100, []),
    ],
)
def test_cache_prune_chooses_old_then_least_recently_used(found, max_age_days, max_mib, removed):
    chosen = cache.choose(found, NOW, max_age_days * DAY, max_mib * 2**20)
    assert [str(e.path) for e in chosen] == removed


def test_cache_prune_command_removes_old_entries_and_stale_locks(cli, home):
    old, fresh = home / "cache" / "sdists" / "old", home / "cache" / "wheelhouses" / "fresh"
    for directory in (old, fresh):
        directory.mkdir(parents=True)
        (directory / "pkg.tar.gz").write_bytes(b"x" * 1000)
    index = home / "cache" / "staged-objects.json"
    index.write_text("{}")
    long_ago = time.time() - 90 * DAY
    os.utime(old, (long_ago, long_ago))
    os.utime(index, (long_ago, long_ago))
    (home / "locks").mkdir()
    (home / "locks" / "gone_job.lock").touch()

    dry = cli("cache", "prune", "--dry-run", check_code=0)
    assert old.exists() and "Would remove 2 cache entries" in dry.stderr
    result = cli("cache", "prune", check_code=0)
    assert not old.exists() and not index.exists() and fresh.exists()
    assert "Removed 2 cache entries" in result.stderr and "1 stale lock file(s)" in result.stderr
    assert result.stderr.count("\n") == 1
    assert not (home / "locks" / "gone_job.lock").exists()


# -- lock files ---------------------------------------------------------------------------------


def test_a_removed_lock_is_never_held_twice(tmp_path):
    """A taker that opened the file before its holder removed it must not believe it holds
    the job's lock once it locks the orphaned inode."""
    path = tmp_path / "job.lock"
    holder = JobLock.try_acquire(path)
    late_fd = os.open(path, os.O_RDWR)  # a taker between its open() and its flock()
    holder.remove()
    assert not path.exists()
    fresh = JobLock.try_acquire(path)  # takes the file now at the path, not the old inode
    assert fresh is not None and path.exists()
    assert os.fstat(fresh.fd).st_ino != os.fstat(late_fd).st_ino
    assert JobLock.try_acquire(path) is None  # held: nobody else gets it
    os.close(late_fd)
    fresh.remove()
    assert not path.exists()


def test_only_unheld_lock_files_are_removed(tmp_path):
    path = tmp_path / "job.lock"
    held = JobLock.try_acquire(path)
    assert remove_if_unowned(path) is False and path.exists()
    held.release()
    assert remove_if_unowned(path) is True and not path.exists()


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
    assert not settings.job_work_dir("launch_fails").exists()
    assert not settings.job_lock_path("launch_fails").exists()


# -- a job dir inside aiptrain's home ------------------------------------------------------------


@pytest.mark.parametrize("where", ["home", "inside", "parent"])
def test_a_job_dir_that_exposes_aiptrains_home_is_refused(cli, home, where):
    home.mkdir(parents=True)
    job_dir = {"home": home, "inside": home / "logs" / "x", "parent": home.parent}[where]
    result = cli("jobs", "submit", "training", "exposes_home", "--package-path",
                 str(REPO / "sample_jobs" / "basic" / "trainer"), "--module-name", "trainer.task",
                 "--job-dir", str(job_dir), "--region", "us-central1", "--runtime-version", "minimal")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "would expose aiptrain's home" in result.stderr
    assert not (home / "jobs.db").exists() or "Listed 0 items." in cli("jobs", "list").stderr


# -- raw bytes to the terminal ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, one_line, shown",
    [
        ("plain\ttab", False, "plain\ttab"),
        ("\x1b[2J\x1b]0;title\x07", False, "\\x1b[2J\\x1b]0;title\\x07"),
        ("line\rover", False, "line\\x0dover"),
        ("a\nb", False, "a\nb"),
        ("a\nb\tc", True, "a\\nb\\tc"),
        ("\x9b31m\x7f", False, "\\x9b31m\\x7f"),
        ("ünïcödé ✓", False, "ünïcödé ✓"),
    ],
)
def test_printable_escapes_terminal_controls(text, one_line, shown):
    assert printable(text, one_line) == shown


def test_error_lines_escape_control_characters_and_lead_with_the_problem(cli, home):
    bad = "job\x1b]0;pwned\x07\nid"
    result = cli("jobs", "describe", bad)
    assert result.returncode == 2
    assert result.stderr == "ERROR: Job [job\\x1b]0;pwned\\x07\\nid] not found; `aiptrain jobs list` shows the jobs that exist.\n"
    usage = cli("jobs", "submit", "training")
    assert usage.returncode == 2
    assert usage.stderr.startswith("ERROR: Missing argument 'JOB'. Usage: aiptrain jobs submit training ")
    assert len(usage.stderr.splitlines()) == 1  # the usage and the way to the help on the same line


NASTY_TRAINER = '''
import sys
print("colour \\x1b[31mred\\x1b[0m and a title \\x1b]0;pwned\\x07", flush=True)
print("carriage\\rreturn", flush=True)
'''


def nasty_package(tmp_path: Path) -> Path:
    package = tmp_path / "nasty" / "trainer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "task.py").write_text(NASTY_TRAINER)
    return package


def run_on_a_tty(args: list[str], **env: str) -> str:
    """Run `python -m aiptrain ARGS` with stdout on a pseudo-terminal; return what it printed."""
    leader, follower = pty.openpty()
    environment = {k: v for k, v in os.environ.items() if k not in ("CI", "NO_COLOR")}
    process = subprocess.Popen([sys.executable, "-m", "aiptrain", *args], stdout=follower,
                               stderr=subprocess.DEVNULL, env={**environment, **env})
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        chunks.append(data)
    process.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks).decode()


@pytest.mark.docker
def test_stream_logs_escapes_on_a_tty_and_pipes_bytes_unchanged(cli, home, docker_api, minimal_runtime, tmp_path):
    job_id = f"nasty_{uuid.uuid4().hex[:8]}"
    cli("jobs", "submit", "training", job_id, "--package-path", str(nasty_package(tmp_path)),
        "--module-name", "trainer.task", "--region", "us-central1", "--runtime-version", minimal_runtime,
        "--stream-logs", check_code=0)
    piped = subprocess.run([sys.executable, "-m", "aiptrain", "jobs", "stream-logs", job_id, "--task-name",
                            "master-replica-0"], capture_output=True, check=True).stdout  # bytes, as written
    assert b"colour \x1b[31mred\x1b[0m and a title \x1b]0;pwned\x07\n" in piped
    assert b"carriage\rreturn\n" in piped
    # The plain lines on a terminal (NO_COLOR): the trainer's control bytes shown, none sent.
    on_tty = run_on_a_tty(["jobs", "stream-logs", job_id, "--task-name", "master-replica-0"], NO_COLOR="1")
    assert "colour \\x1b[31mred\\x1b[0m and a title \\x1b]0;pwned\\x07" in on_tty
    assert "carriage\\x0dreturn" in on_tty
    assert "\x1b" not in on_tty and "\x07" not in on_tty
    # The live view colours its own columns, and shows the trainer's bytes escaped all the same.
    live = run_on_a_tty(["jobs", "stream-logs", job_id, "--task-name", "master-replica-0"])
    assert "\\x1b]0;pwned\\x07" in live and "\x1b]0;pwned" not in live and "\x07" not in live


# -- nothing left behind by a job that ran --------------------------------------------------------


@pytest.mark.docker
def test_a_finished_job_leaves_no_lock_work_dir_or_other_log(cli, home, docker_api, submit_args):
    job_id = f"tidy_{uuid.uuid4().hex[:8]}"
    cli(*submit_args(job_id, "--stream-logs"), check_code=0)
    assert yaml.safe_load(cli("jobs", "describe", job_id, check_code=0).stdout)["state"] == "SUCCEEDED"
    assert sorted(p.name for p in (home / "logs").iterdir()) == [f"{job_id}.jsonl"]
    assert not any((home / "locks").iterdir())
    assert not any((home / "work").iterdir())
    assert job_resources(docker_api, job_id) == []


@pytest.mark.docker
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
    lock = JobLock.try_acquire(settings.job_lock_path(job_id))
    lock.release()  # its submit died
    job = wait_for(lambda: (j := yaml.safe_load(cli("jobs", "describe", job_id, check_code=0).stdout))["state"]
                   == "FAILED" and j, timeout=30, what="the job failed")
    assert "interrupted" in job["errorMessage"]
    assert sorted(p.name for p in (home / "logs").iterdir()) == [f"{job_id}.jsonl"]
    assert not any((home / "locks").iterdir())


# -- evaluators finish their last evaluation -------------------------------------------------------


def config_file(tmp_path: Path) -> str:
    path = tmp_path / "evaluator.yaml"
    path.write_text(yaml.safe_dump({"trainingInput": {
        "scaleTier": "CUSTOM", "masterType": "n1-standard-4",
        "workerType": "n1-standard-4", "workerCount": 1,
        "evaluatorType": "n1-standard-4", "evaluatorCount": 1}}))
    return str(path)


def messages(stderr: str, task: str) -> list[str]:
    fields = (line.split("\t") for line in stderr.splitlines() if line.count("\t") == 4)
    return [f[4] for f in fields if f[2] == task]


@pytest.mark.docker
@pytest.mark.parametrize("grace, evaluator_runs, finishes", [("60", "3", True), ("0.5", "120", False)])
def test_evaluators_get_a_grace_period_after_the_master_succeeds(
    cli, home, docker_api, minimal_runtime, tmp_path, monkeypatch, grace, evaluator_runs, finishes
):
    monkeypatch.setenv("AIPTRAIN_EVALUATOR_GRACE_SECONDS", grace)
    monkeypatch.setenv("AIPTRAIN_STOP_GRACE_SECONDS", "1")
    job_id = f"grace_{uuid.uuid4().hex[:8]}"
    result = cli("jobs", "submit", "training", job_id, "--config", config_file(tmp_path),
                 "--package-path", str(PROBE), "--module-name", "probe.task", "--region", "us-central1",
                 "--runtime-version", minimal_runtime, "--stream-logs", "--",
                 "--run", "master=0.5", "--run", "worker=120", "--run", f"evaluator={evaluator_runs}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    service = messages(result.stderr, "service")
    assert any(m.startswith("The master finished: waiting up to") and "evaluator 0" in m for m in service)
    evaluator = messages(result.stderr, "evaluator-replica-0")
    assert ("probe evaluator 0 exiting with 0" in evaluator) is finishes
    assert "probe worker 0 exiting with 0" not in messages(result.stderr, "worker-replica-0")  # stopped at once
    assert job_resources(docker_api, job_id) == []


@pytest.mark.docker
@pytest.mark.tensorflow
def test_estimator_train_and_evaluate_keeps_the_final_evaluation(cli, home, docker_api, tmp_path):
    require_image(docker_api, "aiptrain/runtime:2.11")
    job_id = f"estimator_{uuid.uuid4().hex[:8]}"
    job_dir = tmp_path / "estimator-out"
    config = tmp_path / "estimator.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {
        "scaleTier": "CUSTOM", "masterType": "n1-standard-4",
        "workerType": "n1-standard-4", "workerCount": 1,
        "parameterServerType": "n1-standard-4", "parameterServerCount": 1,
        "evaluatorType": "n1-standard-4", "evaluatorCount": 1}}))
    steps = 100
    result = cli("jobs", "submit", "training", job_id, "--config", str(config),
                 "--package-path", str(REPO / "sample_jobs" / "tf_estimator" / "trainer"),
                 "--module-name", "trainer.task", "--job-dir", str(job_dir), "--region", "us-central1",
                 "--runtime-version", "2.11", "--stream-logs", "--", "--steps", str(steps), timeout=600)
    assert result.returncode == 0, result.stderr[-5000:]
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    final = json.loads((job_dir / "model" / "export" / "metrics" / f"metrics-{steps}.json").read_text())
    assert final["global_step"] == steps and final["checkpoint"] == f"model.ckpt-{steps}"
    assert final["weight"] == pytest.approx(3.0, abs=0.3) and final["bias"] == pytest.approx(1.0, abs=0.3)
    assert "evaluator 0: done" in messages(result.stderr, "evaluator-replica-0")
    assert job_resources(docker_api, job_id) == []


def test_reading_a_job_removes_the_lock_of_a_submit_killed_before_it_recorded_it(cli, home, tmp_path):
    (home / "locks").mkdir(parents=True)
    (home / "locks" / "never_recorded.lock").touch()
    outside = tmp_path / "outside.lock"
    outside.touch()
    assert cli("jobs", "describe", "never_recorded").returncode == 2
    assert not (home / "locks" / "never_recorded.lock").exists()
    cli("jobs", "describe", f"../../{outside.stem}")  # not a job ID: nothing outside the home is touched
    assert outside.exists()

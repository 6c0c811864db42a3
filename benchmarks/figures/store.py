"""The job store at scale: `jobs list` and `jobs describe` over 10,000 recorded jobs (8)."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

from harness import Bench, Row, interleaved, progress, timed

STORE_JOBS, SMALL_STORE_JOBS = 10_000, 10
STORE_ACTIVE = 3  # RUNNING jobs among them, whose locks the benchmark holds as a submit at work would
DESCRIBED = "census_00003"  # a finished job, in every store fill_store makes


def fill_store(home: Path, count: int) -> list[str]:
    """`count` jobs recorded through the store's own API, one a minute: mostly finished (SUCCEEDED,
    FAILED with an error message, CANCELLED), labelled by team and run, one in a hundred with a
    tuning job's trainingOutput, the newest STORE_ACTIVE still RUNNING. Returns the RUNNING ones."""
    from aiptrain.model import HyperparameterOutput, Job, State, TrainingInput, TrainingOutput
    from aiptrain.store import JobStore

    store = JobStore(home / "jobs.db")
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    endings = [State.SUCCEEDED] * 6 + [State.FAILED] * 2 + [State.CANCELLED]
    tuning = TrainingOutput(completed_trial_count=2, is_hyperparameter_tuning_job=True, trials=[
        HyperparameterOutput(trial_id=str(n), hyperparameters={"lr": str(0.1 / n)}) for n in (1, 2)])
    active = []
    for n in range(count):
        job_id = f"{('census', 'mnist', 'bert')[n % 3]}_{n:05d}"
        training_input = TrainingInput(
            scale_tier="BASIC" if n % 4 else "STANDARD_1", region="us-central1", python_module="trainer.task",
            package_uris=[f"gs://bench/staging/{job_id}/trainer-0.1.tar.gz"], args=["--steps", str(n)],
            job_dir=f"gs://bench/output/{job_id}", runtime_version="2.11", python_version="3.7")
        store.create(Job(job_id=job_id, training_input=training_input, create_time=start + dt.timedelta(minutes=n),
                         labels={"team": ("ml", "vision", "nlp")[n % 3], "run": str(n % 50)}))
        store.transition(job_id, State.RUNNING, [State.QUEUED])
        if n >= count - STORE_ACTIVE:
            active.append(job_id)
            continue
        ending = endings[n % len(endings)]
        failed = "The replica master 0 exited with a non-zero status of 1." if ending is State.FAILED else None
        store.transition(job_id, ending, [State.RUNNING], error_message=failed)
        if n % 100 == 0:
            store.set_training_output(job_id, tuning)
    store.close()
    return active


def bench_list(b: Bench) -> list[Row]:
    from aiptrain.jobpaths import JobPaths
    from aiptrain.ownership import JobLock

    click_label = f"{Path(sys.executable).name} -c 'import click'"
    every = Row("8a", f"jobs list of {STORE_JOBS:,} jobs", "jobs list (the default table)", click_label, "<=0.3 s")
    limited = Row("8b", f"jobs list --limit 20 of {STORE_JOBS:,} jobs", "jobs list --limit 20", click_label, "<=2.0x")
    describe = Row("8c", f"jobs describe among {STORE_JOBS:,} jobs (vs among {SMALL_STORE_JOBS})",
                   f"jobs describe JOB, store of {STORE_JOBS:,}", f"jobs describe JOB, store of {SMALL_STORE_JOBS}",
                   "~1.0x")
    large, small = b.new_home(), b.new_home()
    progress(f"recording {STORE_JOBS:,} jobs through the store's API")
    running = [(large, job_id) for job_id in fill_store(large, STORE_JOBS)]
    running += [(small, job_id) for job_id in fill_store(small, SMALL_STORE_JOBS)]
    # Held by this process as a submit at work would: the controller `jobs list` starts leaves them alone.
    locks = [JobLock.try_acquire(JobPaths(home, job_id).lock) for home, job_id in running]
    click_cmd = [sys.executable, "-c", "import click"]

    def aiptrain(home: Path, *args: str) -> float:
        return b.aiptrain(home, *args)[0]

    try:
        for home in (large, small):  # warm the page cache and the bytecode; not counted
            aiptrain(home, "jobs", "list"), aiptrain(home, "jobs", "describe", DESCRIBED)
        timed(click_cmd)
        interleaved(b.args.repeat, lambda i: every.ours.append(aiptrain(large, "jobs", "list")),
                    lambda i: every.base.append(timed(click_cmd)[0]))
        interleaved(b.args.repeat, lambda i: limited.ours.append(aiptrain(large, "jobs", "list", "--limit", "20")),
                    lambda i: limited.base.append(timed(click_cmd)[0]))
        interleaved(b.args.repeat, lambda i: describe.ours.append(aiptrain(large, "jobs", "describe", DESCRIBED)),
                    lambda i: describe.base.append(aiptrain(small, "jobs", "describe", DESCRIBED)))
    finally:
        for lock in locks:
            lock.release()
    every.notes.append(f"8a's target is absolute: the whole table of {STORE_JOBS:,} jobs in 0.3 s or less; the "
                       "ratio to `import click` is shown for scale.")
    return [every, limited, describe]

"""What `describe`, `list`, `stream-logs` and `cancel` do below the CLI: read a job over the
store, and cancel it. Readers start no process of their own: a reader that finds a job still
active makes sure the home's controller runs (one flock try), which is how any command recovers
a job whose controller died."""

from __future__ import annotations

import shutil
import sys
import time

from aiptrain.backends import Backend, ReplicaStatus
from aiptrain.errors import JobNotFound
from aiptrain.jobkeys import KEY_PATTERN, JobKey
from aiptrain.jobpaths import LOCK_SUFFIX
from aiptrain.jobtable import DamagedRecord
from aiptrain.model import TERMINAL_STATES, Job, State
from aiptrain.ownership import remove_if_unowned
from aiptrain.runner import control
from aiptrain.settings import Settings
from aiptrain.store import JobStore


def remove_stale_locks(settings: Settings, store: JobStore) -> int:
    """Remove lock files of jobs that ended or were never recorded (left by a submit killed
    at the wrong moment, or by older versions); return how many went."""
    removed = 0
    for path in sorted(settings.locks_dir.glob(f"*{LOCK_SUFFIX}")):
        try:
            job = store.get(path.stem)
        except DamagedRecord as exc:
            store.skip_damaged(path.stem, exc.problem)
            continue
        if (job is None or job.state in TERMINAL_STATES) and remove_if_unowned(path):
            removed += 1
    return removed


def find_key(project: str, job_id: str, settings: Settings, store: JobStore) -> JobKey:
    """The key of the job `job_id` of `project` (aiptrain.jobkeys); JobNotFound when the project
    has none (another project's job of that ID included)."""
    key = store.key_of(project, job_id)
    if key is None:
        would_be = store.new_key(project, job_id)
        lock = settings.job_paths(would_be).lock
        if KEY_PATTERN.fullmatch(would_be) and lock.exists():
            remove_if_unowned(lock)  # a submit killed before it recorded the job
        raise JobNotFound(job_id)
    return key


def get_job(key: str, settings: Settings, store: JobStore) -> Job:
    """The job of this key (aiptrain.jobkeys: `find_key` finds it)."""
    job = store.require(key)
    if job.state not in TERMINAL_STATES:
        control.ensure_running(settings)
        full = settings.out_of_space()
        if full:  # the controller cannot record the job's progress: say why it shows an old state
            print(f"WARNING: Job [{job.job_id}] may show an outdated state: {full}", file=sys.stderr, flush=True)
    if job.state is State.QUEUED:
        queued = store.queue_position(key)
        if queued:
            job.job_position = queued[0]
    return job


def wait_until_done(job_id: str, settings: Settings, store: JobStore, timeout: float | None = None) -> Job:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        job = get_job(job_id, settings, store)
        if job.state in TERMINAL_STATES or (deadline is not None and time.monotonic() > deadline):
            return job
        time.sleep(0.1)


def cancel(job_id: str, settings: Settings, store: JobStore, backend: Backend, timeout: float = 60) -> Job:
    """Ask for cancellation and wait (up to `timeout`) until the controller has torn down."""
    job = get_job(job_id, settings, store)
    if job.state in TERMINAL_STATES:
        return job
    cancelling = store.transition(
        job_id,
        State.CANCELLING,
        [State.QUEUED, State.PREPARING, State.RUNNING],
        error_message="Job cancelled by the user.",
    )
    if cancelling is not None and cancelling.state is State.CANCELLING:
        # Stopping the replicas here, not only in the controller, ends the job a poll sooner:
        # their exits wake the controller, which sees the cancel and tears down.
        control.send(settings, control.WAKE, job_id)
        running = [o.container_id for o in backend.observe(job_id) if o.status == ReplicaStatus.RUNNING and o.container_id]
        backend.stop(running, settings.stop_grace_seconds)
    return wait_until_done(job_id, settings, store, timeout)


def forget(key: str, settings: Settings, store: JobStore) -> None:
    """Delete an ended job: its record, its log, its contract and its work dir (what a Vertex AI
    delete of a job does; its output in the bucket stays). The caller checked that it has ended."""
    store.delete(key)
    paths = settings.job_paths(key)
    paths.log.unlink(missing_ok=True)
    paths.contract.unlink(missing_ok=True)
    shutil.rmtree(paths.work_dir, ignore_errors=True)

"""What `describe`, `list`, `stream-logs` and `cancel` do below the CLI: read a job, after
reconciling it if nobody drives it any more, and cancel it."""

from __future__ import annotations

import shutil
import sys
import time

from aiptrain.backends import Backend, ReplicaStatus
from aiptrain.errors import JobNotFound
from aiptrain.jobtable import DamagedRecord
from aiptrain.logs import JobLogWriter
from aiptrain.model import Job, State
from aiptrain.ownership import JobLock, remove_if_unowned
from aiptrain.settings import Settings
from aiptrain.store import JobStore
from aiptrain.validation import JOB_ID_PATTERN


def reconcile(job_id: str, settings: Settings, store: JobStore, backend: Backend) -> None:
    """If the job is active but nobody drives it, take over: restart supervision for a
    launched job or one waiting for admission, or clean up a submission that died before launch."""
    job = store.get(job_id)
    if job is None and JOB_ID_PATTERN.fullmatch(job_id) and settings.job_lock_path(job_id).exists():
        remove_if_unowned(settings.job_lock_path(job_id))  # a submit killed before it recorded the job
    if job is None or job.state.is_terminal:
        return
    lock = JobLock.try_acquire(settings.job_lock_path(job_id))
    if lock is None:
        return  # its submitter or supervisor is alive
    from aiptrain import supervisor  # only for a job nobody drives: rare

    try:
        job = store.get(job_id)
        if job is None or job.state.is_terminal:
            lock.remove()  # it ended while we waited for its lock
            return
        waits_for_admission = job.state is State.QUEUED and store.is_enqueued(job_id)
        if job.state in (State.QUEUED, State.PREPARING) and not waits_for_admission:
            backend.remove(job_id)
            shutil.rmtree(settings.job_work_dir(job_id), ignore_errors=True)
            message = "The job's submission was interrupted before all replicas started."
            with JobLogWriter(settings.job_log_path(job_id)) as job_log:
                job_log.service(message, "ERROR")
            store.transition(job_id, State.FAILED, [State.QUEUED, State.PREPARING], error_message=message)
            supervisor.remove_empty_log(settings, job_id)  # the standby supervisor of the submit that died
            lock.remove()
            return
        full = settings.out_of_space()
        if full:  # its supervisor could not record its progress: say why it shows an old state
            print(f"WARNING: Job [{job_id}] may show an outdated state: {full}", file=sys.stderr, flush=True)
        supervisor.spawn(job_id, lock, settings)
    finally:
        lock.release()


def remove_stale_locks(settings: Settings, store: JobStore) -> int:
    """Remove lock files of jobs that ended or were never recorded (left by a submit killed
    at the wrong moment, or by older versions); return how many went."""
    removed = 0
    for path in sorted(settings.locks_dir.glob("*.lock")):
        try:
            job = store.get(path.stem)
        except DamagedRecord as exc:
            store.skip_damaged(path.stem, exc.problem)
            continue
        if (job is None or job.state.is_terminal) and remove_if_unowned(path):
            removed += 1
    return removed


def get_job(job_id: str, settings: Settings, store: JobStore, backend: Backend) -> Job:
    reconcile(job_id, settings, store, backend)
    job = store.get(job_id)
    if job is None:
        raise JobNotFound(job_id)
    if job.state is State.QUEUED:
        queued = store.queue_position(job_id)
        if queued:
            job.job_position = queued[0]
    return job


def wait_until_done(
    job_id: str, settings: Settings, store: JobStore, backend: Backend, timeout: float | None = None
) -> Job:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        job = get_job(job_id, settings, store, backend)
        if job.state.is_terminal or (deadline is not None and time.monotonic() > deadline):
            return job
        time.sleep(0.1)


def cancel(job_id: str, settings: Settings, store: JobStore, backend: Backend, timeout: float = 60) -> Job:
    """Ask for cancellation and wait (up to `timeout`) until the supervisor has torn down."""
    job = get_job(job_id, settings, store, backend)
    if job.state.is_terminal:
        return job
    cancelling = store.transition(
        job_id,
        State.CANCELLING,
        [State.QUEUED, State.PREPARING, State.RUNNING],
        error_message="Job cancelled by the user.",
    )
    if cancelling is not None and cancelling.state is State.CANCELLING:
        # Stopping the replicas here, not only in the supervisor, ends the job a poll sooner:
        # their exits wake the supervisor, which sees the cancel and tears down.
        running = [o.container_id for o in backend.observe(job_id) if o.status == ReplicaStatus.RUNNING]
        backend.stop(running, settings.stop_grace_seconds)
    return wait_until_done(job_id, settings, store, backend, timeout)

"""The supervisor: one detached process per running job, started by submit (or by any
command that finds a job orphaned), holding the job's lock for as long as it lives.

Each tick it looks at the replicas, copies their output into the job's log file,
and applies lifecycle.decide(): restart replicas killed by a signal, or end the job
(stop what still runs, drain the logs, remove containers and network, then record
the final state: the state is written last, so readers that see it have every line).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from datetime import timedelta

from aiptrain.backends import EXITED, RUNNING, ReplicaObservation
from aiptrain.lifecycle import Decision, decide, failure_message
from aiptrain.logs import SERVICE, JobLogWriter, last_times_by_task, read_records, severity_of
from aiptrain.model import State, utc_now
from aiptrain.ownership import JobLock
from aiptrain.settings import Settings
from aiptrain.store import JobStore
from aiptrain.topology import replicas_for
from aiptrain.validation import parse_duration_seconds

ACTIVE = (State.QUEUED, State.PREPARING, State.RUNNING, State.CANCELLING)
LOG_TAIL_LINES = 20
TRACEBACK_LINES = 60
ENGINE_PATIENCE_SECONDS = 30
SETTLE_CHECKS, SETTLE_SECONDS = 5, 0.05


class LogFollowers:
    """One thread per replica copying its container's output into the job log; re-attached
    after a restart from the last line already copied."""

    def __init__(self, backend, writer: JobLogWriter, resume_from: dict[str, str]):
        from aiptrain.backends.docker import parse_engine_time

        self._backend = backend
        self._writer = writer
        self._last_ns = {task: parse_engine_time(stamp) for task, stamp in resume_from.items()}
        self._threads: dict[str, threading.Thread] = {}
        self._drained: set[str] = set()  # exited replicas whose output is all copied

    def sync(self, observations: list[ReplicaObservation]) -> None:
        for obs in observations:
            thread = self._threads.get(obs.task_name)
            if thread and thread.is_alive():
                continue
            if obs.status == EXITED and obs.task_name in self._drained:
                continue
            thread = threading.Thread(target=self._follow, args=(obs,), daemon=True)
            self._threads[obs.task_name] = thread
            thread.start()

    def restarted(self, task_name: str) -> None:
        self._drained.discard(task_name)

    def _follow(self, obs: ReplicaObservation) -> None:
        from aiptrain.backends.docker import parse_engine_time

        try:
            for chunk in self._backend.follow_logs(obs.container_id, self._last_ns.get(obs.task_name)):
                self._writer.write(obs.task_name, severity_of(chunk.stream, chunk.text), chunk.text, chunk.time)
                self._last_ns[obs.task_name] = parse_engine_time(chunk.time)
        except Exception:  # the container vanished under us: its logs went with it
            pass
        if obs.status == EXITED:
            self._drained.add(obs.task_name)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in list(self._threads.values()):
            thread.join(max(0.0, deadline - time.monotonic()))


class Supervisor:
    def __init__(self, job_id: str, settings: Settings, store: JobStore, backend):
        self.job_id = job_id
        self.settings = settings
        self.store = store
        self.backend = backend
        self.log_path = settings.job_log_path(job_id)
        self.writer = JobLogWriter(self.log_path)

    def run(self) -> State:
        job = self.store.get(self.job_id)
        if job is None or job.state not in ACTIVE:
            return job.state if job else State.STATE_UNSPECIFIED
        expected = [r.task_name for r in replicas_for(job.training_input)]
        followers = LogFollowers(self.backend, self.writer, last_times_by_task(self.log_path))
        max_running = None
        if job.training_input.scheduling and job.training_input.scheduling.max_running_time:
            max_running = parse_duration_seconds(job.training_input.scheduling.max_running_time, "maxRunningTime")

        # Docker events wake the loop the moment a replica starts or dies; the poll is the fallback.
        stop, changed = threading.Event(), threading.Event()
        watcher = threading.Thread(
            target=self.backend.wait_for_changes, args=(self.job_id, stop, changed), daemon=True
        )
        watcher.start()
        settle = 0
        try:
            while True:
                job = self.store.get(self.job_id)
                if job.state in (State.QUEUED, State.PREPARING):
                    # Submit died before the launch finished; what exists is incomplete.
                    message = "The job's submission was interrupted before all replicas started."
                    return self.finish(Decision(State.FAILED, message), followers, [])
                if self.ran_too_long(job, max_running):
                    continue
                observations = self.observe()
                followers.sync(observations)
                decision = decide(
                    expected,
                    observations,
                    self.store.restarts(self.job_id),
                    self.settings.max_restarts,
                    cancel_requested=job.state is State.CANCELLING,
                )
                if (decision.state or decision.restart) and self.cancel_arrived(job.state):
                    decision = Decision(State.CANCELLED)  # `jobs cancel` stops replicas: not failures
                if decision.state is not None:
                    return self.finish(decision, followers, observations)
                for task in decision.restart:
                    self.restart(task, observations, followers)
                # The engine may still list a replica as running just after its `die` event:
                # look again shortly after every event, then fall back to the poll.
                settle = SETTLE_CHECKS if changed.is_set() else max(0, settle - 1)
                changed.clear()
                changed.wait(SETTLE_SECONDS if settle else self.settings.poll_seconds)
        finally:
            stop.set()

    def cancel_arrived(self, state_seen: State) -> bool:
        return state_seen is not State.CANCELLING and self.store.get(self.job_id).state is State.CANCELLING

    def ran_too_long(self, job, max_running: float | None) -> bool:
        """Past scheduling.maxRunningTime the job is cancelled, as the service does."""
        if job.state is not State.RUNNING or not max_running or not job.start_time:
            return False
        if utc_now() - job.start_time <= timedelta(seconds=max_running):
            return False
        limit = job.training_input.scheduling.max_running_time
        self.store.transition(
            self.job_id, State.CANCELLING, [State.RUNNING],
            error_message=f"Job cancelled: it ran longer than scheduling.maxRunningTime ({limit}).",
        )
        return True

    def observe(self) -> list[ReplicaObservation]:
        """The replicas' states, riding out a Docker engine that is briefly unreachable
        (restarting, overloaded) instead of failing a healthy job."""
        import tenacity

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_delay(ENGINE_PATIENCE_SECONDS),
            wait=tenacity.wait_exponential(multiplier=0.1, max=2),
            reraise=True,
        )
        return retrying(self.backend.observe, self.job_id)

    def restart(self, task: str, observations: list[ReplicaObservation], followers: LogFollowers) -> None:
        obs = next(o for o in observations if o.task_name == task)
        count = self.store.count_restart(self.job_id, task)
        self.writer.service(
            f"{failure_message(task, obs.exit_code)} Restarting it in place "
            f"(restart {count} of {self.settings.max_restarts}).",
            "WARNING",
        )
        followers.restarted(task)
        self.backend.restart(obs.container_id)

    def finish(self, decision: Decision, followers: LogFollowers, observations: list[ReplicaObservation]) -> State:
        still_running = [o.container_id for o in observations if o.status == RUNNING]
        self.backend.stop(still_running, self.settings.stop_grace_seconds)  # stopped by us: never a failure
        followers.sync(self.backend.observe(self.job_id))  # output of replicas not followed yet
        followers.join(timeout=15)
        error = self.error_message(decision)
        if decision.state is State.SUCCEEDED:
            self.writer.service("Job completed successfully.")
        elif decision.state is State.FAILED:
            self.writer.service(error, "ERROR")
            self.writer.service("Finished tearing down training program.")
            self.writer.service("Job failed.")
        else:
            self.writer.service("Job cancelled.")
        self.backend.remove(self.job_id)
        shutil.rmtree(self.settings.job_work_dir(self.job_id), ignore_errors=True)
        job = self.store.transition(self.job_id, decision.state, ACTIVE, error_message=error)
        return job.state if job else decision.state

    def error_message(self, decision: Decision) -> str | None:
        if decision.state is State.CANCELLED:
            job = self.store.get(self.job_id)
            return job.error_message or "Job cancelled by the user."
        if decision.state is not State.FAILED:
            return None
        message = decision.error_message or "The job failed."
        if decision.failed_task:
            lines = [r.message for r in read_records(self.log_path)[0] if r.task == decision.failed_task]
            tail = log_tail(lines)
            if tail:
                message += "\n" + "\n".join(tail)
        return (
            f"{message}\n\nTo find out more about why your job exited please check the logs: "
            f"aiptrain jobs stream-logs {self.job_id}"
        )


def log_tail(lines: list[str]) -> list[str]:
    """The end of a failed replica's output for its error message: from the last traceback
    on when there is one (as AI Platform shows it), else the last lines."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if starts and len(lines) - starts[-1] <= TRACEBACK_LINES:
        return lines[starts[-1]:]
    return lines[-LOG_TAIL_LINES:]


def spawn(job_id: str, lock: JobLock, settings: Settings) -> int:
    """Start a detached supervisor that inherits `lock`; return its PID."""
    settings.logs_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.logs_dir / f"{job_id}.supervisor.log", "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "aiptrain.supervisor", job_id, str(lock.fd)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            pass_fds=(lock.fd,),
            start_new_session=True,  # Ctrl-C in the terminal stops the stream, not the job
            env={**os.environ, "AIPTRAIN_HOME": str(settings.home)},
        )
    return process.pid


def main(argv: list[str]) -> int:
    job_id, lock_fd = argv[0], int(argv[1])
    lock = JobLock(lock_fd)  # inherited, already held
    settings = Settings()
    store = JobStore(settings.store_path)
    from aiptrain.backends.docker import DockerBackend

    supervisor = Supervisor(job_id, settings, store, DockerBackend(settings.installation_id))
    try:
        supervisor.run()
        return 0
    except Exception:
        traceback.print_exc()
        # Do not leave the job in limbo: tear down and record why.
        try:
            supervisor.backend.remove(job_id)
        except Exception:
            traceback.print_exc()
        reason = traceback.format_exc().strip().splitlines()[-1]
        supervisor.writer.write(SERVICE, "ERROR", f"aiptrain's supervisor failed: {reason}")
        store.transition(job_id, State.FAILED, ACTIVE, error_message=f"aiptrain's supervisor failed: {reason}")
        return 4
    finally:
        lock.release()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

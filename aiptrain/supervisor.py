"""The supervisor: one detached process per running job, started by submit (or by any
command that finds a job orphaned), holding the job's lock for as long as it lives.

Each tick it looks at the replicas, copies their output into the job's log file,
and applies lifecycle.decide(): restart replicas killed by a signal, or end the job
(stop what still runs, drain the logs, remove containers and network, then record
the final state: the state is written last, so readers that see it have every line).
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
from datetime import timedelta

from aiptrain import admission
from aiptrain.backends import Backend, ReplicaObservation, ReplicaStatus, open_backend
from aiptrain.errors import AiptrainError
from aiptrain.jobtable import DamagedRecord
from aiptrain.lifecycle import SETTLE_CHECKS, Decision, Settle, awaited_at_end, decide, failure_message, replica_label
from aiptrain.logs import (CLOSING_LINES, SERVICE, JobLogWriter, last_times_by_task, parse_engine_time, record_line,
                           records_of_task, severity_of)
from aiptrain.model import State, utc_now
from aiptrain.ownership import JobLock
from aiptrain.planning import load_plan_inputs, plan
from aiptrain.settings import Settings
from aiptrain.store import JobStore
from aiptrain.topology import replicas_for
from aiptrain.validation import scheduling_seconds

log = logging.getLogger(__name__)

ACTIVE = (State.QUEUED, State.PREPARING, State.RUNNING, State.CANCELLING)
LOG_TAIL_LINES = 20
TRACEBACK_LINES = 60
ENGINE_PATIENCE_SECONDS = 30
ORPHAN_CHECK_POLLS = 20  # a queued job looks for orphaned jobs ahead of it every this many polls


class LogFollowers:
    """One thread per replica copying its container's output into the job log; re-attached
    after a restart from the last line already copied. Replicas are keyed by (trial, task):
    every trial of a tuning job has its own master-replica-0."""

    def __init__(self, backend: Backend, writer: JobLogWriter, resume_from: dict[tuple[str, str], str]):
        self._backend = backend
        self._writer = writer
        self._last_stamp = dict(resume_from)  # the engine's time of the last line copied
        self._threads: dict[tuple[str, str], threading.Thread] = {}
        self._drained: set[tuple[str, str]] = set()  # exited replicas whose output is all copied
        self._batches = 0  # batches copied so far, by every thread: their progress

    def sync(self, observations: list[ReplicaObservation]) -> None:
        for obs in observations:
            key = (obs.trial_id, obs.task_name)
            thread = self._threads.get(key)
            if thread and thread.is_alive():
                continue
            if obs.status == ReplicaStatus.EXITED and key in self._drained:
                continue
            thread = threading.Thread(target=self._follow, args=(obs,), daemon=True)
            self._threads[key] = thread
            thread.start()

    def restarted(self, trial_id: str, task_name: str) -> None:
        self._drained.discard((trial_id, task_name))

    def _follow(self, obs: ReplicaObservation) -> None:
        key = (obs.trial_id, obs.task_name)
        since = self._last_stamp.get(key)
        task, trial = obs.task_name, obs.trial_id
        try:
            for chunks in self._backend.follow_logs(obs.container_id, parse_engine_time(since) if since else None):
                self._writer.write_lines([
                    record_line(chunk.time, task, severity_of(chunk.stream, chunk.text), chunk.text, trial)
                    for chunk in chunks
                ])
                self._last_stamp[key] = chunks[-1].time
                self._batches += 1
        except Exception:  # the container vanished under us: its logs went with it
            pass
        if obs.status == ReplicaStatus.EXITED:
            self._drained.add(key)

    def join(self, patience: float, trial_id: str | None = None) -> None:
        """Wait for the followers (of one trial, when given) to copy everything, however long
        that takes while they copy; give up once none has copied anything for `patience` seconds."""
        progress, stalled_since = self._batches, time.monotonic()
        for (trial, _), thread in list(self._threads.items()):
            if trial_id is not None and trial != trial_id:
                continue
            while thread.is_alive() and time.monotonic() - stalled_since < patience:
                thread.join(0.5)
                if self._batches != progress:
                    progress, stalled_since = self._batches, time.monotonic()


class Supervisor:
    """Drives one job: a plain job here, a tuning job through aiptrain.tuning.Study. Both use
    the same per-group steps (a group is the job's replicas, or one trial's)."""

    def __init__(self, job_id: str, settings: Settings, store: JobStore, backend: Backend):
        self.job_id = job_id
        self.settings = settings
        self.store = store
        self.backend = backend
        self.log_path = settings.job_log_path(job_id)
        self.writer = JobLogWriter(self.log_path, keep_going=True)  # a full disk loses lines, not the job
        self.followers = LogFollowers(backend, self.writer, last_times_by_task(self.log_path))
        self.changed = threading.Event()  # set by the engine's events: a replica started or stopped

    def run(self) -> State:
        job = self.store.get(self.job_id)
        if job is None or job.state not in ACTIVE:
            return job.state if job else State.STATE_UNSPECIFIED
        verdict = self.store.verdict(self.job_id)
        if verdict is not None:  # a predecessor decided and died tearing down: finish its ending
            failed_trial = verdict.pop("failed_trial", "")
            return self.finish(Decision(State(verdict.pop("state")), **verdict), self.observe(), failed_trial)
        if job.state is State.QUEUED and self.store.is_enqueued(self.job_id):
            ended = self.await_admission()
            if ended is not None:
                return ended
        # Docker events wake the loop the moment a replica starts or dies; the poll is the fallback.
        stop = threading.Event()
        watcher = threading.Thread(
            target=self.backend.wait_for_changes, args=(self.job_id, stop, self.changed), daemon=True
        )
        watcher.start()
        try:
            if job.training_input.hyperparameters:
                from aiptrain.tuning import Study

                return Study(self).run()
            return self.run_job()
        finally:
            stop.set()

    def await_admission(self) -> State | None:
        """Wait in QUEUED until aiptrain.admission lets the job start, then start it; the job's
        final state instead when it ends first (cancelled, past maxWaitTime, or its launch failed)."""
        job = self.store.get(self.job_id)
        max_wait = scheduling_seconds(job, "max_wait_time")
        override = self.settings.max_running_replicas
        queued = self.store.queue_position(self.job_id)
        said, polls = queued[1] if queued else None, 0  # submit logged the first reason
        while True:
            job = self.store.get(self.job_id)
            if job.state is State.CANCELLING:
                return self.finish(Decision(State.CANCELLED), [])
            if job.state is not State.QUEUED:
                return None
            if admission.waited_too_long(job.create_time, utc_now(), max_wait):
                message = (f"Job cancelled: it waited longer than scheduling.maxWaitTime "
                           f"({job.training_input.scheduling.max_wait_time}) to start. {said or ''}").strip()
                self.writer.service(message, "WARNING")
                self.store.transition(self.job_id, State.CANCELLING, [State.QUEUED], error_message=message)
                continue
            verdict = admission.peek(self.store, job, override)
            if verdict is None or verdict.admitted or verdict.reason != said:
                verdict = admission.request(self.store, job, override)  # decided again under the write lock
            if verdict.admitted:
                break
            if verdict.reason != said:
                said = verdict.reason
                self.writer.service(said)
            polls += 1
            if polls % ORPHAN_CHECK_POLLS == 0:
                self.reconcile_others()
            time.sleep(self.settings.admission_poll_seconds)
        return self.start_admitted()

    def start_admitted(self) -> State | None:
        """Launch an admitted job's replicas from the plan inputs its submit left."""
        job = self.store.get(self.job_id)
        work_dir = self.settings.job_work_dir(self.job_id)
        inputs = load_plan_inputs(work_dir)
        launch_plan = None if job.training_input.hyperparameters else plan(
            job, replicas_for(job.training_input), inputs)
        try:
            start_job(self.job_id, self.store, self.backend, launch_plan, self.writer, work_dir)
        except AiptrainError:
            return State.FAILED
        return None

    def reconcile_others(self) -> None:
        """Jobs ahead in the queue or holding capacity whose supervisor died would keep this one
        waiting: take them over (aiptrain.jobs.reconcile), as any command touching them would."""
        from aiptrain.jobs import reconcile

        for job_id in self.store.admission_job_ids():
            if job_id == self.job_id:
                break
            try:
                reconcile(job_id, self.settings, self.store, open_backend(self.settings, self.store.backend_of(job_id)))
            except DamagedRecord:  # nothing can drive a job whose record cannot be read: wait on the others
                continue

    def run_job(self) -> State:
        job = self.store.get(self.job_id)
        expected = [r.task_name for r in replicas_for(job.training_input)]
        max_running = scheduling_seconds(job, "max_running_time")
        settle = Settle(SETTLE_CHECKS)  # a replica may have ended before the watcher listened: look soon
        while True:
            job = self.store.get(self.job_id)
            if job.state in (State.QUEUED, State.PREPARING):
                # Submit died before the launch finished; what exists is incomplete.
                message = "The job's submission was interrupted before all replicas started."
                return self.finish(Decision(State.FAILED, message), [])
            if self.ran_too_long(job, max_running):
                continue
            observations = self.observe()
            decision = self.step_group(expected, observations, job.state)
            if decision.state is not None:
                return self.finish(decision, observations)
            self.wait(settle)

    # -- steps shared with the study loop -------------------------------------------------

    def wait(self, settle: "Settle") -> None:
        """Sleep until the engine reports a change or the poll is due. The engine may still
        list a replica as running just after its `die` event: look again shortly after
        every event, then fall back to the poll."""
        seconds = settle.after(self.changed.is_set(), self.settings.poll_seconds)
        self.changed.clear()
        self.changed.wait(seconds)

    def step_group(self, expected: list[str], observations: list[ReplicaObservation], state_seen: State,
                   trial_id: str = "") -> Decision:
        """Follow the group's logs, apply lifecycle.decide and restart what it says to.
        A decision to end the group comes back to the caller."""
        self.followers.sync(observations)
        restarts = self.store.restarts(self.job_id)
        decision = decide(
            expected,
            observations,
            {task: restarts.get(restart_key(trial_id, task), 0) for task in expected},
            self.settings.max_restarts,
            cancel_requested=state_seen is State.CANCELLING,
        )
        if (decision.state or decision.restart) and self.cancel_arrived(state_seen):
            return Decision(State.CANCELLED)  # `jobs cancel` stops replicas: not failures
        for task in decision.restart:
            self.restart(task, observations, trial_id)
        return Decision(state=decision.state, error_message=decision.error_message,
                        failed_task=decision.failed_task)

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

    def observe(self, trial_id: str | None = None) -> list[ReplicaObservation]:
        """The replicas' states (of one trial, when given), riding out a Docker engine that is
        briefly unreachable (restarting, overloaded) instead of failing a healthy job."""
        import tenacity

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_delay(ENGINE_PATIENCE_SECONDS),
            wait=tenacity.wait_exponential(multiplier=0.1, max=2),
            reraise=True,
        )
        observations = retrying(self.backend.observe, self.job_id)
        return observations if trial_id is None else [o for o in observations if o.trial_id == trial_id]

    def restart(self, task: str, observations: list[ReplicaObservation], trial_id: str = "") -> None:
        obs = next(o for o in observations if o.task_name == task)
        count = self.store.count_restart(self.job_id, restart_key(trial_id, task))
        self.writer.service(
            f"{failure_message(task, obs.exit_code)} Restarting it in place "
            f"(restart {count} of {self.settings.max_restarts}).",
            "WARNING",
            trial_id,
        )
        self.followers.restarted(trial_id, task)
        self.backend.restart(obs.container_id)

    def end_group(self, observations: list[ReplicaObservation], trial_id: str | None = None) -> None:
        """Stop what still runs (stopped by us: never a failure), copy the remaining output,
        and remove the group's containers and network. Evaluators of a successful master
        first get their grace period to finish on their own."""
        cancelling = self.store.get(self.job_id).state is State.CANCELLING
        awaited = {o.container_id for o in awaited_at_end(observations, cancelling)}
        if awaited:
            self.stop_running([o for o in observations if o.container_id not in awaited])
            observations = self.await_replicas(awaited, trial_id)
        self.stop_running(observations)
        self.followers.sync(self.observe(trial_id))  # output of replicas not followed yet
        self.followers.join(patience=15, trial_id=trial_id)
        self.backend.remove(self.job_id, trial_id)

    def stop_running(self, observations: list[ReplicaObservation]) -> None:
        running = [o.container_id for o in observations if o.status == ReplicaStatus.RUNNING]
        if running:
            self.backend.stop(running, self.settings.stop_grace_seconds)

    def await_replicas(self, container_ids: set[str], trial_id: str | None) -> list[ReplicaObservation]:
        """Wait up to the evaluator grace period (plus at most one poll) for these replicas to
        exit, or for a cancel; return the group's observations as they are then."""
        grace = self.settings.evaluator_grace_seconds
        observations = self.observe(trial_id)
        waiting = [o for o in observations if o.container_id in container_ids]
        names = ", ".join(replica_label(o.task_name) for o in waiting)
        self.writer.service(f"The master finished: waiting up to {grace:g} s for {names} to finish on its own.",
                            trial=trial_id or "")
        deadline, settle = time.monotonic() + grace, Settle()
        while time.monotonic() < deadline:
            self.followers.sync(observations)
            if not any(o.container_id in container_ids and o.status == ReplicaStatus.RUNNING for o in observations):
                break
            if self.store.get(self.job_id).state is State.CANCELLING:
                break
            self.wait(settle)
            observations = self.observe(trial_id)
        return observations

    def finish(self, decision: Decision, observations: list[ReplicaObservation], failed_trial: str = "") -> State:
        """End the job: keep the decision, tear everything down, say how it ended (once), then
        record the final state (written last, so readers that see it have every line). A
        supervisor killed anywhere in here is followed by one that finishes the same ending."""
        self.store.record_verdict(self.job_id, {
            "state": decision.state.value, "error_message": decision.error_message,
            "failed_task": decision.failed_task, "failed_trial": failed_trial,
        })
        try:
            self.end_group(observations)
        except AiptrainError as exc:  # e.g. a network the engine keeps: the job ended as decided all the same
            self.writer.service(f"Tearing down left something behind: {exc}", "WARNING")
        error = self.error_message(decision, failed_trial)
        if self.writer.lost:
            self.writer.service(f"{self.writer.lost} line(s) of this job's log were lost: the disk of "
                                f"[{self.log_path.parent}] was full.", "WARNING")
        if not self.said_how_it_ended():
            if decision.state is State.SUCCEEDED:
                self.writer.service("Job completed successfully.")
            elif decision.state is State.FAILED:
                self.writer.service(error, "ERROR")
                self.writer.service("Finished tearing down training program.")
                self.writer.service("Job failed.")
            else:
                self.writer.service("Job cancelled.")
        return self.record(decision.state, error)

    def said_how_it_ended(self) -> bool:
        """Whether the log already ends with a closing line (a predecessor wrote it, then died)."""
        service = [r for r in records_of_task(self.log_path, SERVICE) if not r.trial]
        return bool(service) and service[-1].message in CLOSING_LINES

    def record(self, state: State, error: str | None) -> State:
        shutil.rmtree(self.settings.job_work_dir(self.job_id), ignore_errors=True)
        job = self.store.transition(self.job_id, state, ACTIVE, error_message=error)
        self.release_shared()
        return job.state if job else state

    def release_shared(self) -> None:
        """The last active job of the installation takes down what its jobs share (the storage
        endpoint); a failure there never changes how the job ended."""
        try:
            self.backend.release_shared(lambda: bool(self.store.active_job_ids()))
        except Exception as exc:  # noqa: BLE001 - logged; the next job's end or launch tries again
            log.warning("Could not release what the installation's jobs share: %s", exc)

    def error_message(self, decision: Decision, failed_trial: str = "") -> str | None:
        if decision.state is State.CANCELLED:
            job = self.store.get(self.job_id)
            return job.error_message or "Job cancelled by the user."
        if decision.state is not State.FAILED:
            return None
        message = decision.error_message or "The job failed."
        if decision.failed_task:
            records = records_of_task(self.log_path, decision.failed_task)
            lines = [r.message for r in records if r.trial == failed_trial]
            tail = log_tail(lines)
            if tail:
                message += "\n" + "\n".join(tail)
        return (
            f"{message}\n\nTo find out more about why your job exited please check the logs: "
            f"aiptrain jobs stream-logs {self.job_id}"
        )


def restart_key(trial_id: str, task: str) -> str:
    """Restarts are counted per replica: per trial's replica in a tuning job."""
    return f"{trial_id}/{task}" if trial_id else task


def start_job(job_id: str, store: JobStore, backend: Backend, launch_plan, job_log: JobLogWriter, work_dir,
              report=lambda step: None) -> None:
    """From an admitted (PREPARING) job to RUNNING, telling the job's log as the service would:
    launch its replicas (a study, `launch_plan` None, launches its trials itself). A launch
    that fails fails the job, and raises."""
    job_log.service("Waiting for job to be provisioned.")
    if launch_plan is None:
        store.transition(job_id, State.RUNNING, [State.PREPARING])
        return
    report(f"Starting {len(launch_plan.containers)} replica(s)")
    try:
        backend.launch(launch_plan)
    except AiptrainError as exc:
        job_log.service(str(exc), "ERROR")
        shutil.rmtree(work_dir, ignore_errors=True)
        store.transition(job_id, State.FAILED, [State.PREPARING, State.CANCELLING], str(exc))
        raise
    store.transition(job_id, State.RUNNING, [State.PREPARING])
    job_log.service("Waiting for training program to start.")


def log_tail(lines: list[str]) -> list[str]:
    """The end of a failed replica's output for its error message: from the last traceback
    on when there is one (as AI Platform shows it), else the last lines."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if starts and len(lines) - starts[-1] <= TRACEBACK_LINES:
        return lines[starts[-1]:]
    return lines[-LOG_TAIL_LINES:]


def spawn(job_id: str, lock: JobLock, settings: Settings, go_fd: int | None = None) -> int:
    """Start a detached supervisor that inherits `lock`; return its PID. With `go_fd` (the read
    end of a pipe) it gets ready, then waits for a word on it before driving the job."""
    settings.logs_dir.mkdir(parents=True, exist_ok=True)
    waits = () if go_fd is None else (go_fd,)
    with open(settings.supervisor_log_path(job_id), "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "aiptrain.supervisor", job_id, str(lock.fd), *map(str, waits)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            pass_fds=(lock.fd, *waits),
            start_new_session=True,  # Ctrl-C in the terminal stops the stream, not the job
            env={**os.environ, "AIPTRAIN_HOME": str(settings.home)},
        )
    return process.pid


class Standby:
    """A supervisor started ahead of the launch, so that its start-up (the interpreter, its
    imports, its connection to the engine: a few hundred milliseconds on a small machine)
    overlaps the replicas' start instead of following it. `go()` once the replicas run;
    `abandon()` when the submission failed. If submit dies first, the supervisor sees the pipe
    close, exits without touching anything, and so frees the job's lock for the next command."""

    GO = b"go"

    def __init__(self, job_id: str, lock: JobLock, settings: Settings):
        self._job_id, self._settings = job_id, settings
        read_end, self._write_end = os.pipe()
        try:
            spawn(job_id, lock, settings, read_end)
        except BaseException:
            os.close(self._write_end)
            raise
        finally:
            os.close(read_end)

    def go(self) -> None:
        os.write(self._write_end, self.GO)
        os.close(self._write_end)

    def abandon(self) -> None:
        os.close(self._write_end)
        self._settings.supervisor_log_path(self._job_id).unlink(missing_ok=True)


def released(go_fd: int, backend) -> bool:
    """Wait for submit's word, connected to the engine meanwhile; False if submit failed or died."""
    backend.warm_up()
    with os.fdopen(go_fd, "rb") as pipe:
        return pipe.read(len(Standby.GO)) == Standby.GO


def main(argv: list[str]) -> int:
    job_id, lock_fd = argv[0], int(argv[1])
    settings = Settings()
    lock = JobLock(lock_fd, settings.job_lock_path(job_id))  # inherited, already held
    store = JobStore(settings.store_path)
    backend = open_backend(settings, store.backend_of(job_id))
    if len(argv) > 2 and not released(int(argv[2]), backend):
        return 0  # the job was refused, failed at launch, or its submit died: not ours to drive
    supervisor = Supervisor(job_id, settings, store, backend)  # opens the job's log: only once released
    try:
        supervisor.run()
        return 0
    except Exception as exc:
        _tried(traceback.print_exc)  # on a full disk even this may not fit
        if isinstance(exc, (OSError, sqlite3.DatabaseError)) and settings.out_of_space():
            # The disk is full, not the job broken: nothing can be recorded now, so the job is left
            # as it is (replicas, verdict) for a successor, which any command reading the job
            # starts, saying the disk is full, and which ends it as decided once there is room.
            return 3
        reason = traceback.format_exc().strip().splitlines()[-1]
        # Do not leave the job in limbo: tear down and record why.
        _tried(supervisor.backend.remove, job_id)
        _tried(supervisor.writer.write, SERVICE, "ERROR", f"aiptrain's supervisor failed: {reason}")
        shutil.rmtree(settings.job_work_dir(job_id), ignore_errors=True)
        store.transition(job_id, State.FAILED, ACTIVE, error_message=f"aiptrain's supervisor failed: {reason}")
        return 4
    finally:
        leave(job_id, lock, settings, store)


def _tried(step, *args) -> None:
    """A step of the crash handler: one that fails does not keep the others from running."""
    try:
        step(*args)
    except Exception:
        pass


def leave(job_id: str, lock: JobLock, settings: Settings, store: JobStore) -> None:
    """Let go of the job: an empty supervisor log is never kept (a crash's traceback is), and a
    job that ended needs no lock file either. The log goes while the lock is held: no successor
    has opened it yet."""
    remove_empty_log(settings, job_id)
    job = store.get(job_id)
    if job is None or not job.state.is_terminal:
        lock.release()  # another command reconciles it
        return
    lock.remove()


def remove_empty_log(settings: Settings, job_id: str) -> None:
    """A supervisor's log opens when it starts; one that had nothing to say leaves nothing behind
    (one released by a submit that then died, say). Call with the job's lock held."""
    supervisor_log = settings.supervisor_log_path(job_id)
    try:
        if supervisor_log.stat().st_size == 0:
            supervisor_log.unlink()
    except FileNotFoundError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

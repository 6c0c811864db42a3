"""One job's driver: a state machine the controller steps, never a loop.

`JobDriver.step()` looks once and acts once, then says when it wants to look again:

  admission  QUEUED in the admission queue: may it start (aiptrain.admission)? past maxWaitTime?
  launch     admitted (PREPARING): launch the replicas from the plan inputs submit left
  running    observe -> lifecycle.decide -> restart replicas killed by a signal, or end the job;
             past maxRunningTime the job is cancelled. A tuning job runs its study (runner.study).
  ending     the decision is recorded (the verdicts table) first; then its GroupEnding: evaluators'
             grace, stop what runs, drain the logs, remove containers and network; then the
             closing lines, and the final state last (readers that see it have every line).

Every step is idempotent given what the store and the engine say, so a controller killed
anywhere is followed by one whose first step of the job picks up where it stood: a recorded
verdict is finished as decided, an admitted job whose launch was cut is launched again.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING

import tenacity

from aiptrain import admission
from aiptrain.backends import Backend, ReplicaObservation, ReplicaStatus
from aiptrain.errors import AiptrainError
from aiptrain.lifecycle import Decision, awaited_at_end, decide, failure_message
from aiptrain.logs import CLOSING_LINES, SERVICE, JobLogWriter, last_times_by_task, records_of_task
from aiptrain.model import ACTIVE_STATES, State, utc_now
from aiptrain.planning import load_plan_inputs, plan
from aiptrain.runner.logcopy import Drain, LogFollowers
from aiptrain.settings import Settings
from aiptrain.topology import replicas_for, task_label
from aiptrain.validation import scheduling_seconds

if TYPE_CHECKING:
    from aiptrain.runner.study import Study

log = logging.getLogger(__name__)

# Packages imported by two threads at once can end half-initialized (circular imports inside
# them): the steps' lazy imports of big packages go one thread at a time.
STUDY_IMPORT = threading.Lock()

LOG_TAIL_LINES = 20
TRACEBACK_LINES = 60
ENGINE_PATIENCE_SECONDS = 30
INTERRUPTED = "The job's submission was interrupted before all replicas started."
QUEUED_LOOK_SECONDS = 5.0  # how often a job behind the head of the queue looks (for maxWaitTime)
DRAIN_LOOK_SECONDS = 0.02  # how soon a group's end looks again whether its logs are all copied
LAUNCH_STARTED = "launch-started"  # in the job's work dir: a launch began (a new controller cleans up first)


def restart_key(trial_id: str, task: str) -> str:
    """Restarts are counted per replica: per trial's replica in a tuning job."""
    return f"{trial_id}/{task}" if trial_id else task


class GroupEnding:
    """Ending one group (the job's replicas, or one trial's) in steps: evaluators of a successful
    master get their grace period to finish on their own; then what still runs is stopped
    (stopped by us: never a failure), the remaining output copied, containers and network removed."""

    def __init__(self, driver: JobDriver, observations: list[ReplicaObservation], trial_id: str | None = None):
        self.driver, self.trial_id = driver, trial_id
        self.observations = observations
        cancelling = driver.store.get(driver.job_id).state is State.CANCELLING
        self.awaited = {o.container_id for o in awaited_at_end(observations, cancelling)}
        self.deadline = 0.0
        self.drain: Drain | None = None
        if self.awaited:
            driver.stop_running([o for o in observations if o.container_id not in self.awaited])
            grace = driver.settings.evaluator_grace_seconds
            names = ", ".join(task_label(o.task_name) for o in observations if o.container_id in self.awaited)
            driver.writer.service(f"The master finished: waiting up to {grace:g} s for {names} to finish on its own.",
                                  trial=trial_id or "")
            self.deadline = time.monotonic() + grace

    def step(self) -> bool:
        """One step further; True once the group is gone."""
        driver = self.driver
        if self.awaited:
            observations = driver.observe(self.trial_id)
            driver.followers.sync(observations)
            self.observations = observations
            still = any(o.container_id in self.awaited and o.status == ReplicaStatus.RUNNING for o in observations)
            cancelled = driver.store.get(driver.job_id).state is State.CANCELLING
            if still and not cancelled and time.monotonic() < self.deadline:
                return False
            self.awaited = set()
        if self.drain is None:
            driver.stop_running(self.observations)
            driver.followers.sync(driver.observe(self.trial_id))  # output of replicas not followed yet
            self.drain = Drain(driver.followers, self.trial_id)
        if not self.drain.done():
            return False
        driver.backend.remove(driver.job_id, self.trial_id)
        return True


class JobDriver:
    """Drives one job, plain or a study, one step at a time."""

    def __init__(self, job_id: str, settings: Settings, store, backend: Backend):
        self.job_id = job_id
        self.settings = settings
        self.store = store
        self.backend = backend
        self.log_path = settings.job_log_path(job_id)
        self.writer = JobLogWriter(self.log_path, keep_going=True)  # a full disk loses lines, not the job
        self.followers = LogFollowers(backend, self.writer, last_times_by_task(self.log_path), self.log_path)
        self.phase = "adopt"
        self.study: Study | None = None  # of a tuning job, once running
        self.said: str | None = None  # the last admission reason logged
        self.ending: GroupEnding | None = None
        self.decision: Decision | None = None
        self.failed_trial = ""
        self.final_state: State | None = None

    @property
    def ended(self) -> bool:
        return self.phase == "done"

    def step(self) -> float | None:
        """Look once, act once; seconds until the next look is due (sooner when the engine reports
        a change), None once the job has ended."""
        delay = getattr(self, f"_step_{self.phase}")()
        return None if self.phase == "done" else delay

    def close(self) -> None:
        self.writer.close()

    # -- phases ---------------------------------------------------------------------------------

    def _step_adopt(self) -> float:
        """The first look, by a new controller or for a new job: where does the job stand?"""
        job = self.store.get(self.job_id)
        if job is None or job.state not in ACTIVE_STATES:
            self.phase = "done"
            return 0
        verdict = self.store.verdict(self.job_id)
        if verdict is not None:  # decided, then the controller died tearing down: finish that ending
            failed_trial = verdict.pop("failed_trial", "")
            self.begin_end(Decision(State(verdict.pop("state")), **verdict), self.observe(), failed_trial)
        elif job.state is State.QUEUED and self.store.is_enqueued(self.job_id):
            queued = self.store.queue_position(self.job_id)
            self.said = queued[1] if queued else None  # submit logged the first reason
            self.phase = "admission"
        elif job.state is State.PREPARING and self.store.is_enqueued(self.job_id):
            self.phase = "launch"
        elif job.state in (State.QUEUED, State.PREPARING):  # recorded, never queued: its submit died
            self.writer.service(INTERRUPTED, "ERROR")
            self.begin_end(Decision(State.FAILED, INTERRUPTED), [])
        else:
            self.phase = "running"
        return 0

    def _step_admission(self) -> float:
        """Only the head of the queue may start (aiptrain.admission): it asks, under the store's
        write lock, each look; the others only watch for a cancel and for maxWaitTime, and look
        less often (the controller wakes the head when room appears, a cancel wakes its job)."""
        job = self.store.get(self.job_id)
        if job.state is State.CANCELLING:
            self.begin_end(Decision(State.CANCELLED), [])
            return 0
        if job.state is not State.QUEUED:
            self.phase = "adopt"
            return 0
        if admission.waited_too_long(job.create_time, utc_now(), scheduling_seconds(job, "max_wait_time")):
            message = (f"Job cancelled: it waited longer than scheduling.maxWaitTime "
                       f"({job.training_input.scheduling.max_wait_time}) to start. {self.said or ''}").strip()
            self.writer.service(message, "WARNING")
            self.store.transition(self.job_id, State.CANCELLING, [State.QUEUED], error_message=message)
            return 0
        queued = self.store.queue_position(self.job_id)
        if queued is not None and queued[0] > 1:
            return QUEUED_LOOK_SECONDS
        verdict = admission.request(self.store, job, self.settings.max_running_replicas)
        if verdict.admitted:
            self.phase = "launch"
            return 0
        if verdict.reason and verdict.reason != self.said:
            self.said = verdict.reason
            self.writer.service(verdict.reason)
        return self.settings.admission_poll_seconds

    def _step_launch(self) -> float:
        """Launch an admitted job's replicas from the plan inputs its submit left (a study's trials
        are launched by the study). Whatever a cut launch left is removed first."""
        job = self.store.get(self.job_id)
        if job.state is State.CANCELLING:
            self.begin_end(Decision(State.CANCELLED), self.observe())
            return 0
        if job.state is not State.PREPARING:
            self.phase = "adopt"
            return 0
        self.writer.service("Waiting for job to be provisioned.")
        if not job.training_input.hyperparameters:
            launch_plan = plan(job, replicas_for(job.training_input), load_plan_inputs(self.work_dir))
            started = self.work_dir / LAUNCH_STARTED
            if started.exists():  # a controller died launching it: what it made goes first
                self.backend.remove(self.job_id)
            started.touch()
            try:
                self.backend.launch(launch_plan)
            except AiptrainError as exc:
                self.writer.service(str(exc), "ERROR")
                self.begin_end(Decision(State.FAILED, str(exc)), [])
                return 0
        started = self.store.transition(self.job_id, State.RUNNING, [State.PREPARING]) is not None
        if started and not job.training_input.hyperparameters:  # a study says so of each trial
            self.writer.service("Waiting for training program to start.")
        self.phase = "running"
        return 0

    def _step_running(self) -> float:
        job = self.store.get(self.job_id)
        if job.state in (State.QUEUED, State.PREPARING):
            self.phase = "adopt"
            return 0
        if self.ran_too_long(job):
            return 0
        if job.training_input.hyperparameters:
            if self.study is None:
                with STUDY_IMPORT:  # optuna, for studies only, imported by one thread at a time
                    from aiptrain.runner.study import Study
                self.study = Study(self)
            return self.study.step(job)
        observations = self.observe()
        decision = self.step_group([r.task_name for r in replicas_for(job.training_input)], observations, job.state)
        if decision.state is not None:
            self.begin_end(decision, observations)
            return 0
        return self.settings.poll_seconds

    def _step_ending(self) -> float:
        assert self.ending is not None and self.decision is not None  # begin_end set them
        try:
            if not self.ending.step():  # evaluators' grace (their exit wakes us), or the drain
                return self.settings.poll_seconds if self.ending.awaited else DRAIN_LOOK_SECONDS
        except AiptrainError as exc:  # e.g. a network the engine keeps: the job ended as decided all the same
            self.writer.service(f"Tearing down left something behind: {exc}", "WARNING")
        self.final_state = self.close_job(self.decision, self.failed_trial)
        self.phase = "done"
        return 0

    # -- steps shared with the study ------------------------------------------------------------

    @property
    def work_dir(self):
        return self.settings.job_work_dir(self.job_id)

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

    def ran_too_long(self, job) -> bool:
        """Past scheduling.maxRunningTime the job is cancelled, as the service does."""
        max_running = scheduling_seconds(job, "max_running_time")
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
        """The replicas' states (of one trial, when given)."""
        observations = patiently(self.backend.observe, self.job_id)
        return observations if trial_id is None else [o for o in observations if o.trial_id == trial_id]

    def restart(self, task: str, observations: list[ReplicaObservation], trial_id: str = "") -> None:
        obs = next(o for o in observations if o.task_name == task and o.container_id)
        count = self.store.count_restart(self.job_id, restart_key(trial_id, task))
        self.writer.service(
            f"{failure_message(task, obs.exit_code)} Restarting it in place "
            f"(restart {count} of {self.settings.max_restarts}).",
            "WARNING",
            trial_id,
        )
        self.followers.restarted(trial_id, task)
        patiently(self.backend.restart, obs.container_id or "")  # an engine going down kills replicas too

    def stop_running(self, observations: list[ReplicaObservation]) -> None:
        running = [o.container_id for o in observations if o.status == ReplicaStatus.RUNNING and o.container_id]
        if running:
            self.backend.stop(running, self.settings.stop_grace_seconds)

    # -- the end --------------------------------------------------------------------------------

    def begin_end(self, decision: Decision, observations: list[ReplicaObservation], failed_trial: str = "") -> None:
        """Keep the decision (a controller killed from here on is followed by one that finishes
        the same ending), then tear down step by step."""
        assert decision.state is not None  # a decision to end
        self.store.record_verdict(self.job_id, {
            "state": decision.state.value, "error_message": decision.error_message,
            "failed_task": decision.failed_task, "failed_trial": failed_trial,
        })
        self.decision, self.failed_trial = decision, failed_trial
        self.ending = GroupEnding(self, observations)
        self.phase = "ending"

    def close_job(self, decision: Decision, failed_trial: str = "") -> State:
        """Say how the job ended (once), then record the final state."""
        error = self.error_message(decision, failed_trial)
        if self.writer.lost:
            self.writer.service(f"{self.writer.lost} line(s) of this job's log were lost: the disk of "
                                f"[{self.log_path.parent}] was full.", "WARNING")
        if not self.said_how_it_ended():
            if decision.state is State.SUCCEEDED:
                self.writer.service("Job completed successfully.")
            elif decision.state is State.FAILED:
                self.writer.service(error or "", "ERROR")
                self.writer.service("Finished tearing down training program.")
                self.writer.service("Job failed.")
            else:
                self.writer.service("Job cancelled.")
        shutil.rmtree(self.work_dir, ignore_errors=True)
        assert decision.state is not None
        job = self.store.transition(self.job_id, decision.state, ACTIVE_STATES, error_message=error)
        return job.state if job and job.state else decision.state

    def said_how_it_ended(self) -> bool:
        """Whether the log already ends with a closing line (a predecessor wrote it, then died)."""
        service = [r for r in records_of_task(self.log_path, SERVICE) if not r.trial]
        return bool(service) and service[-1].message in CLOSING_LINES

    def error_message(self, decision: Decision, failed_trial: str = "") -> str | None:
        if decision.state is State.CANCELLED:
            job = self.store.get(self.job_id)
            return job.error_message or "Job cancelled by the user."
        if decision.state is not State.FAILED:
            return None
        message = decision.error_message or "The job failed."
        if decision.failed_task:
            records = records_of_task(self.log_path, decision.failed_task)
            tail = log_tail([r.message for r in records if r.trial == failed_trial])
            if tail:
                message += "\n" + "\n".join(tail)
        return (
            f"{message}\n\nTo find out more about why your job exited please check the logs: "
            f"aiptrain jobs stream-logs {self.job_id}"
        )

    def fail(self, reason: str) -> None:
        """The last resort when a step raised something unexpected: never leave the job in limbo;
        tear down and record why. Each part is tried even when another fails."""
        for part in (lambda: self.backend.remove(self.job_id),
                     lambda: self.writer.write(SERVICE, "ERROR", f"aiptrain's controller failed: {reason}"),
                     lambda: shutil.rmtree(self.work_dir, ignore_errors=True),
                     lambda: self.store.transition(self.job_id, State.FAILED, ACTIVE_STATES,
                                                   error_message=f"aiptrain's controller failed: {reason}")):
            try:
                part()
            except Exception as exc:  # noqa: BLE001 - the others still run
                log.warning("Failing job %s left something: %s", self.job_id, exc)
        self.phase = "done"


def patiently(call, *args):
    """`call(*args)`, riding out a Docker engine that is briefly unreachable (restarting,
    overloaded) instead of failing a healthy job: tried again for up to ENGINE_PATIENCE_SECONDS."""
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_delay(ENGINE_PATIENCE_SECONDS),
        wait=tenacity.wait_exponential(multiplier=0.1, max=2),
        reraise=True,
    )
    return retrying(call, *args)


def log_tail(lines: list[str]) -> list[str]:
    """The end of a failed replica's output for its error message: from the last traceback
    on when there is one (as AI Platform shows it), else the last lines."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if starts and len(lines) - starts[-1] <= TRACEBACK_LINES:
        return lines[starts[-1]:]
    return lines[-LOG_TAIL_LINES:]


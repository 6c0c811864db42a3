"""One job's driver: a state machine the controller steps, never a loop.

`JobDriver.step()` looks once and acts once, then says when it wants to look again:

  admission  QUEUED in the admission queue: may it start (aiptrain.admission)? past maxWaitTime?
  launch     admitted (PREPARING): launch the replicas from the plan inputs submit left
  running    observe -> lifecycle.decide -> restart replicas killed by a signal, or end the job;
             past maxRunningTime the job is cancelled. A tuning job runs its study (runner.study).
  ending     the decision is recorded (the verdicts table) first; then its GroupEnding
             (runner.groups, what the driver and the study share): evaluators' grace, stop what runs, drain the logs, remove containers and network; then the
             closing lines, and the final state last (readers that see it have every line).

Every step is idempotent given what the store and the engine say, so a controller killed
anywhere is followed by one whose first step of the job picks up where it stood: a recorded
verdict is finished as decided, an admitted job whose launch was cut is launched again.
"""

from __future__ import annotations

import enum
import logging
import shutil
import threading
from collections.abc import Callable
from datetime import timedelta

from aiptrain import admission
from aiptrain.backends import Backend
from aiptrain.errors import AiptrainError
from aiptrain.lifecycle import Decision
from aiptrain.logs import CLOSING_LINES, SERVICE, JobLogWriter, last_times_by_task, records_of_task
from aiptrain.model import ACTIVE_STATES, Job, State, utc_now
from aiptrain.planning import load_plan_inputs, plan
from aiptrain.replicas import ReplicaObservation
from aiptrain.runner.groups import DRAIN_LOOK_SECONDS, GroupEnding, Groups
from aiptrain.runner.logcopy import LogFollowers
from aiptrain.runner.study import Study
from aiptrain.settings import Settings
from aiptrain.store import JobStore
from aiptrain.topology import replicas_for
from aiptrain.validation import scheduling_seconds

log = logging.getLogger(__name__)

# Packages imported by two threads at once can end half-initialized (circular imports inside
# them): the steps' lazy imports of big packages go one thread at a time.
STUDY_IMPORT = threading.Lock()

INTERRUPTED = "The job's submission was interrupted before all replicas started."
QUEUED_LOOK_SECONDS = 5.0  # how often a job behind the head of the queue looks (for maxWaitTime)


class Phase(str, enum.Enum):
    """Where a job's driver stands: each phase is one `_step_<phase>` method."""

    ADOPT = "adopt"  # the first look, by a new controller or for a new job
    ADMISSION = "admission"  # QUEUED in the admission queue
    LAUNCH = "launch"  # admitted (PREPARING): its replicas are launched
    RUNNING = "running"  # observed and decided on, or its study stepped
    ENDING = "ending"  # the decision recorded; its GroupEnding tears down
    DONE = "done"  # the final state recorded


class JobDriver:
    """Drives one job, plain or a study, one step at a time."""

    def __init__(self, job_id: str, settings: Settings, store: JobStore, backend: Backend):
        self.job_id = job_id  # the job's key in the store (aiptrain.jobkeys), as everything below names it
        self.settings = settings
        self.store = store
        self.backend = backend
        self.paths = settings.job_paths(job_id)
        self.log_path = self.paths.log
        self.writer = JobLogWriter(self.log_path, keep_going=True)  # a full disk loses lines, not the job
        followers = LogFollowers(backend, self.writer, last_times_by_task(self.log_path), self.log_path)
        self.groups = Groups(job_id, settings, store, backend, self.log_path, self.writer, followers)
        self.phase = Phase.ADOPT
        self.study: Study | None = None  # of a tuning job, once running
        self.said: str | None = None  # the last admission reason logged
        self.ending: GroupEnding | None = None
        self.decision: Decision | None = None
        self.failed_trial = ""
        self.final_state: State | None = None

    @property
    def ended(self) -> bool:
        return self.phase is Phase.DONE

    def step(self) -> float | None:
        """Look once, act once; seconds until the next look is due (sooner when the engine reports
        a change), None once the job has ended."""
        steps: dict[Phase, Callable[[], float]] = {
            Phase.ADOPT: self._step_adopt, Phase.ADMISSION: self._step_admission, Phase.LAUNCH: self._step_launch,
            Phase.RUNNING: self._step_running, Phase.ENDING: self._step_ending,
        }
        delay = steps[self.phase]() if self.phase is not Phase.DONE else 0
        return None if self.phase is Phase.DONE else delay

    def close(self) -> None:
        self.writer.close()

    # -- phases ---------------------------------------------------------------------------------

    def _step_adopt(self) -> float:
        """The first look, by a new controller or for a new job: where does the job stand?"""
        job = self.store.get(self.job_id)
        if job is None or job.state not in ACTIVE_STATES:
            self.phase = Phase.DONE
            return 0
        verdict = self.store.verdict(self.job_id)
        if verdict is not None:  # decided, then the controller died tearing down: finish that ending
            failed_trial = verdict.pop("failed_trial", "")
            self.begin_end(Decision(State(verdict.pop("state")), **verdict), self.groups.observe(), failed_trial)
        elif job.state is State.QUEUED and self.store.is_enqueued(self.job_id):
            queued = self.store.queue_position(self.job_id)
            self.said = queued[1] if queued else None  # submit logged the first reason
            self.phase = Phase.ADMISSION
        elif job.state is State.PREPARING and self.store.is_enqueued(self.job_id):
            self.phase = Phase.LAUNCH
        elif job.state in (State.QUEUED, State.PREPARING):  # recorded, never queued: its submit died
            self.writer.service(INTERRUPTED, "ERROR")
            self.begin_end(Decision(State.FAILED, INTERRUPTED), [])
        else:
            self.phase = Phase.RUNNING
        return 0

    def _step_admission(self) -> float:
        """Only the head of the queue may start (aiptrain.admission): it asks, under the store's
        write lock, each look; the others only watch for a cancel and for maxWaitTime, and look
        less often (the controller wakes the head when room appears, a cancel wakes its job)."""
        job = self.store.require(self.job_id)
        if job.state is State.CANCELLING:
            self.begin_end(Decision(State.CANCELLED), [])
            return 0
        if job.state is not State.QUEUED:
            self.phase = Phase.ADOPT
            return 0
        waited = job.create_time and admission.waited_too_long(job.create_time, utc_now(),
                                                               scheduling_seconds(job, "max_wait_time"))
        if waited:
            scheduling = job.training_input.scheduling
            limit = scheduling.max_wait_time if scheduling else None
            if self.groups.rules.limits_fail:
                message = f"The job did not start within scheduling.maxWaitTime ({limit}). {self.said or ''}".strip()
                self.writer.service(message, "ERROR")
                self.begin_end(Decision(State.FAILED, message), [])
                return 0
            message = (f"Job cancelled: it waited longer than scheduling.maxWaitTime ({limit}) to start. "
                       f"{self.said or ''}").strip()
            self.writer.service(message, "WARNING")
            self.store.transition(self.job_id, State.CANCELLING, [State.QUEUED], error_message=message)
            return 0
        queued = self.store.queue_position(self.job_id)
        if queued is not None and queued[0] > 1:
            return QUEUED_LOOK_SECONDS
        verdict = admission.request(self.store, self.job_id, job, self.settings.max_running_replicas)
        if verdict.admitted:
            self.phase = Phase.LAUNCH
            return 0
        if verdict.reason and verdict.reason != self.said:
            self.said = verdict.reason
            self.writer.service(verdict.reason)
        return self.settings.admission_poll_seconds

    def _step_launch(self) -> float:
        """Launch an admitted job's replicas from the plan inputs its submit left (a study's trials
        are launched by the study). Whatever a cut launch left is removed first."""
        job = self.store.require(self.job_id)
        if job.state is State.CANCELLING:
            self.begin_end(Decision(State.CANCELLED), self.groups.observe())
            return 0
        if job.state is not State.PREPARING:
            self.phase = Phase.ADOPT
            return 0
        self.writer.service("Waiting for job to be provisioned.")
        if not job.training_input.hyperparameters:
            launch_plan = plan(job, replicas_for(job.training_input), load_plan_inputs(self.paths.plan_inputs),
                               key=self.job_id)
            started = self.paths.launch_started
            if started.exists():  # a controller died launching it: what it made goes first
                self.backend.remove(self.job_id)
            started.touch()
            try:
                self.backend.launch(launch_plan)
            except AiptrainError as exc:
                self.writer.service(str(exc), "ERROR")
                self.begin_end(Decision(State.FAILED, str(exc)), [])
                return 0
        now_running = self.store.transition(self.job_id, State.RUNNING, [State.PREPARING]) is not None
        if now_running and not job.training_input.hyperparameters:  # a study says so of each trial
            self.writer.service("Waiting for training program to start.")
        self.phase = Phase.RUNNING
        return 0

    def _step_running(self) -> float:
        job = self.store.require(self.job_id)
        if job.state in (State.QUEUED, State.PREPARING):
            self.phase = Phase.ADOPT
            return 0
        if self.ran_too_long(job):
            return 0
        if job.training_input.hyperparameters:
            if self.study is None:
                with STUDY_IMPORT:  # optuna, for studies only, imported by one thread at a time
                    self.study = Study(self.groups)
            outcome = self.study.step(job)
            if isinstance(outcome, Decision):  # every trial is gone: the job ends as the study says
                self.begin_end(outcome, [])
                return 0
            return outcome
        observations = self.groups.observe()
        expected = [r.task_name for r in replicas_for(job.training_input)]
        decision = self.groups.step_group(expected, observations, job.state)
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
        self.phase = Phase.DONE
        return 0

    # -- the job's own ------------------------------------------------------------------------

    def ran_too_long(self, job: Job) -> bool:
        """Past scheduling.maxRunningTime the job is cancelled, as the service does, or fails
        where its rules say so (RunRules.limits_fail)."""
        max_running = scheduling_seconds(job, "max_running_time")
        if job.state is not State.RUNNING or not max_running or not job.start_time:
            return False
        if utc_now() - job.start_time <= timedelta(seconds=max_running):
            return False
        scheduling = job.training_input.scheduling
        limit = scheduling.max_running_time if scheduling else None
        if self.groups.rules.limits_fail and not job.training_input.hyperparameters:  # a study ends its trials
            message = f"The job ran longer than scheduling.maxRunningTime ({limit}): its replicas were stopped."
            self.writer.service(message, "ERROR")
            self.begin_end(Decision(State.FAILED, message), self.groups.observe())
            return True
        self.store.transition(
            self.job_id, State.CANCELLING, [State.RUNNING],
            error_message=f"Job cancelled: it ran longer than scheduling.maxRunningTime ({limit}).",
        )
        return True

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
        self.ending = GroupEnding(self.groups, observations)
        self.phase = Phase.ENDING

    def close_job(self, decision: Decision, failed_trial: str = "") -> State:
        """Say how the job ended (once), then record the final state."""
        error = self.groups.error_message(decision, failed_trial)
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
        shutil.rmtree(self.paths.work_dir, ignore_errors=True)
        assert decision.state is not None
        if decision.state is State.SUCCEEDED:
            self.record_model_path()
        job = self.store.transition(self.job_id, decision.state, ACTIVE_STATES, error_message=error)
        return job.state if job and job.state else decision.state

    def record_model_path(self) -> None:
        """A built-in algorithm's job (its trainingOutput says so from its submit) that succeeded:
        builtInAlgorithmOutput.modelPath, its job dir's model/. A tuning job's trials have their
        own (runner.study), the job none, as on the service."""
        job = self.store.require(self.job_id)
        output = job.training_output
        if output is None or output.built_in_algorithm_output is None or job.training_input.hyperparameters:
            return
        output.built_in_algorithm_output = output.built_in_algorithm_output.succeeded_in(job.training_input.job_dir)
        self.store.set_training_output(self.job_id, output)

    def said_how_it_ended(self) -> bool:
        """Whether the log already ends with a closing line (a predecessor wrote it, then died)."""
        service = [r for r in records_of_task(self.log_path, SERVICE) if not r.trial]
        return bool(service) and service[-1].message in CLOSING_LINES

    def fail(self, reason: str) -> None:
        """The last resort when a step raised something unexpected: never leave the job in limbo;
        tear down and record why. Each part is tried even when another fails."""
        for part in (lambda: self.backend.remove(self.job_id),
                     lambda: self.writer.write(SERVICE, "ERROR", f"aiptrain's controller failed: {reason}"),
                     lambda: shutil.rmtree(self.paths.work_dir, ignore_errors=True),
                     lambda: self.store.transition(self.job_id, State.FAILED, ACTIVE_STATES,
                                                   error_message=f"aiptrain's controller failed: {reason}")):
            try:
                part()
            except Exception as exc:  # noqa: BLE001 - the others still run
                log.warning("Failing job %s left something: %s", self.job_id, exc)
        self.phase = Phase.DONE


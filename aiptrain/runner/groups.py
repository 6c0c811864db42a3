"""What the driver and the study both do to a group of replicas (a plain job's replicas, or one
trial's): look at them, apply the lifecycle rule and restart what it says to, stop them, say why
they failed, and end them step by step (GroupEnding). Its own room, so that the driver runs a
study and the study runs trials without either importing the other.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import tenacity

from aiptrain.backends import Backend
from aiptrain.lifecycle import Decision, RunRules, awaited_at_end, decide, failure_message
from aiptrain.logs import JobLogWriter, records_of_task
from aiptrain.model import State
from aiptrain.planning import load_plan_inputs
from aiptrain.replicas import ReplicaObservation, ReplicaStatus
from aiptrain.runner.logcopy import Drain, LogFollowers
from aiptrain.settings import Settings
from aiptrain.store import JobStore
from aiptrain.topology import task_label

LOG_TAIL_LINES = 20
TRACEBACK_LINES = 60
ENGINE_PATIENCE_SECONDS = 30
DRAIN_LOOK_SECONDS = 0.02  # how soon a group's end looks again whether its logs are all copied

T = TypeVar("T")


def restart_key(trial_id: str, task: str) -> str:
    """Restarts are counted per replica: per trial's replica in a tuning job."""
    return f"{trial_id}/{task}" if trial_id else task


class Groups:
    """One job's replica groups: the store, the backend, the log and its followers, shared by
    the job's driver and, for a tuning job, its study."""

    def __init__(self, job_id: str, settings: Settings, store: JobStore, backend: Backend, log_path: Path,
                 writer: JobLogWriter, followers: LogFollowers):
        self.job_id, self.settings, self.store, self.backend = job_id, settings, store, backend
        self.log_path, self.writer, self.followers = log_path, writer, followers

    @functools.cached_property
    def rules(self) -> RunRules:
        """The job's own rules (lifecycle.RunRules), as its submit left them with the plan inputs;
        AI Platform's where it left none."""
        path = self.settings.job_paths(self.job_id).plan_inputs
        if not path.is_file():
            return RunRules()
        return load_plan_inputs(path).rules or RunRules()

    @property
    def max_restarts(self) -> int:
        return self.rules.restart_budget(self.settings.max_restarts)

    def observe(self, trial_id: str | None = None) -> list[ReplicaObservation]:
        """The replicas' states (of one trial, when given)."""
        observations = patiently(self.backend.observe, self.job_id)
        return observations if trial_id is None else [o for o in observations if o.trial_id == trial_id]

    def step_group(self, expected: list[str], observations: list[ReplicaObservation], state_seen: State | None,
                   trial_id: str = "") -> Decision:
        """Follow the group's logs, apply lifecycle.decide and restart what it says to.
        A decision to end the group comes back to the caller."""
        self.followers.sync(observations)
        restarts = self.store.restarts(self.job_id)
        decision = decide(
            expected,
            observations,
            {task: restarts.get(restart_key(trial_id, task), 0) for task in expected},
            self.max_restarts,
            cancel_requested=state_seen is State.CANCELLING,
            restart_together=self.rules.restart_together,
        )
        if (decision.state or decision.restart) and self.cancel_arrived(state_seen):
            return Decision(State.CANCELLED)  # `jobs cancel` stops replicas: not failures
        if decision.restart:
            self.restart(decision.restart, decision.restart_alongside, observations, trial_id)
        return Decision(state=decision.state, error_message=decision.error_message,
                        failed_task=decision.failed_task)

    def cancelling(self) -> bool:
        """Whether the job is being cancelled, as the store says now."""
        return self.store.require(self.job_id).state is State.CANCELLING

    def cancel_arrived(self, state_seen: State | None) -> bool:
        return state_seen is not State.CANCELLING and self.cancelling()

    def restart(self, tasks: tuple[str, ...], alongside: tuple[str, ...], observations: list[ReplicaObservation],
                trial_id: str = "") -> None:
        """Start the replicas killed by a signal again in place (each restart counted against its
        budget), and with them those `alongside` (RunRules.restart_together), stopped first if
        they still run: every replica of the group then starts over at once."""
        seen = {o.task_name: o for o in observations if o.container_id}
        for task in tasks:
            count = self.store.count_restart(self.job_id, restart_key(trial_id, task))
            self.writer.service(
                f"{failure_message(task, seen[task].exit_code)} Restarting it in place "
                f"(restart {count} of {self.max_restarts}).",
                "WARNING",
                trial_id,
            )
        others = [seen[task] for task in alongside if task in seen]
        if others:
            names = ", ".join(task_label(o.task_name) for o in others)
            self.writer.service(f"Restarting {names} with it: this job restarts all its replicas when one restarts.",
                                "WARNING", trial_id)
            self.stop_running(others)
        for task in (*tasks, *(o.task_name for o in others)):
            self.followers.restarted(trial_id, task)
            patiently(self.backend.restart, seen[task].container_id or "")  # an engine going down kills replicas too

    def stop_running(self, observations: list[ReplicaObservation]) -> None:
        running = [o.container_id for o in observations if o.status == ReplicaStatus.RUNNING and o.container_id]
        if running:
            self.backend.stop(running, self.settings.stop_grace_seconds)

    def error_message(self, decision: Decision, failed_trial: str = "") -> str | None:
        """The job's (or a trial's) error message for a decision: the user's cancel, or the
        failure with the failed replica's log tail."""
        if decision.state is State.CANCELLED:
            return self.store.require(self.job_id).error_message or "Job cancelled by the user."
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
            f"aiptrain jobs stream-logs {self.store.require(self.job_id).job_id}"  # its ID, not its key
        )


class GroupEnding:
    """Ending one group (the job's replicas, or one trial's) in steps: evaluators of a successful
    master get their grace period to finish on their own; then what still runs is stopped
    (stopped by us: never a failure), the remaining output copied, containers and network removed."""

    def __init__(self, groups: Groups, observations: list[ReplicaObservation], trial_id: str | None = None):
        self.groups, self.trial_id = groups, trial_id
        self.observations = observations
        self.awaited = {o.container_id for o in awaited_at_end(observations, groups.cancelling())}
        self.deadline = 0.0
        self.drain: Drain | None = None
        if self.awaited:
            groups.stop_running([o for o in observations if o.container_id not in self.awaited])
            grace = groups.settings.evaluator_grace_seconds
            names = ", ".join(task_label(o.task_name) for o in observations if o.container_id in self.awaited)
            groups.writer.service(f"The master finished: waiting up to {grace:g} s for {names} to finish on its own.",
                                  trial=trial_id or "")
            self.deadline = time.monotonic() + grace

    def step(self) -> bool:
        """One step further; True once the group is gone."""
        groups = self.groups
        if self.awaited:
            observations = groups.observe(self.trial_id)
            groups.followers.sync(observations)
            self.observations = observations
            still = any(o.container_id in self.awaited and o.status == ReplicaStatus.RUNNING for o in observations)
            if still and not groups.cancelling() and time.monotonic() < self.deadline:
                return False
            self.awaited = set()
        if self.drain is None:
            groups.stop_running(self.observations)
            groups.followers.sync(groups.observe(self.trial_id))  # output of replicas not followed yet
            self.drain = Drain(groups.followers, self.trial_id)
        if not self.drain.done():
            return False
        groups.backend.remove(groups.job_id, self.trial_id)
        return True


def patiently(call: Callable[..., T], *args: object) -> T:
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

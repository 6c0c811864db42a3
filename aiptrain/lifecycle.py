"""What the replicas' states mean for the job: one pure rule, table-tested.

- Cancel intent beats everything: the job ends CANCELLED, whatever the exit codes.
- The master decides: when it exits 0 the job SUCCEEDED; the others are then stopped
  (parameter servers never exit by themselves), except evaluators, which first get a
  grace period to score the final checkpoint and exit on their own (`awaited_at_end`).
- A replica killed by a signal (exit 130, 137 or 143, the codes AI Platform and
  Kubeflow treat as retryable) is restarted in place, up to `max_restarts` times.
- Any other non-zero exit, a replica over its restart budget, or a replica whose
  container vanished fails the job; the earliest such failure is the one reported.

A job may ask for other rules than AI Platform's (RunRules, given by a dialect such as Vertex
AI's): its own restart budget, every replica restarted when one is, and a job past its
maxRunningTime or maxWaitTime ended FAILED instead of CANCELLED.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from aiptrain.model import State
from aiptrain.replicas import ReplicaObservation, ReplicaStatus
from aiptrain.topology import MASTER_TASK, task_label

RETRYABLE_EXIT_CODES = frozenset({130, 137, 143})
# The engine lists a replica as running for a while after its `die` event, until it has cleaned up
# after it (40 to 60 ms on a quiet 2-core machine, up to 0.3 s on a busy one), and only then has its
# log the last line when that has no newline: after an engine event about a job, the controller
# looks at it again after each of these waits, closer together while the end is likeliest.
SETTLE_LOOKS = (0.025,) * 4 + (0.05,) * 6


@dataclass(frozen=True)
class RunRules:
    """How a job's run is governed where its dialect's rules differ from AI Platform's, which
    the defaults are. Saved with the plan inputs, so every controller that drives the job
    applies them."""

    # The job's own restart budget for each replica (None: Settings.max_restarts); 0 never
    # restarts a replica: the first one killed fails the job.
    max_restarts: int | None = None
    # A replica restarted in place restarts every other replica of its group with it, for
    # trainers that cannot take a peer leaving and joining (their cluster starts over together).
    restart_together: bool = False
    # Past scheduling.maxRunningTime, or maxWaitTime, the job ends FAILED; AI Platform cancels it.
    limits_fail: bool = False

    def restart_budget(self, default: int) -> int:
        return default if self.max_restarts is None else self.max_restarts


@dataclass(frozen=True)
class Decision:
    state: State | None = None  # the terminal state to end in; None keeps the job running
    error_message: str | None = None
    failed_task: str | None = None  # whose log tail belongs in the error message
    restart: tuple[str, ...] = ()  # task names to start again: replicas killed by a signal
    restart_alongside: tuple[str, ...] = ()  # the others, started again with them (RunRules.restart_together)


def failure_message(task_name: str, exit_code: int | None, restarts: int = 0, error: str = "") -> str:
    if exit_code is None and error:
        return f"The replica {task_label(task_name)} did not run: {error.rstrip('.')}."
    if exit_code is None:
        return f"The replica {task_label(task_name)} disappeared: its container was removed."
    message = f"The replica {task_label(task_name)} exited with a non-zero status of {exit_code}."
    if restarts:
        message += f" It had been restarted {restarts} time{'s' if restarts > 1 else ''} already."
    return message


def master_succeeded(observations: list[ReplicaObservation]) -> bool:
    return any(o.task_name == MASTER_TASK and o.status == ReplicaStatus.EXITED and o.exit_code == 0
               for o in observations)


def awaited_at_end(observations: list[ReplicaObservation], cancel_requested: bool) -> list[ReplicaObservation]:
    """The running replicas a group's end lets finish on their own (within a grace period)
    before stopping them: evaluators, once the master succeeded. An Estimator evaluator scores
    the checkpoint the master wrote last only after the master has exited. Workers and
    parameter servers are stopped at once; after a cancel nobody is waited for."""
    if cancel_requested or not master_succeeded(observations):
        return []
    return [o for o in observations if o.task_type == "evaluator" and o.status == ReplicaStatus.RUNNING]


_EPOCH = datetime.min.replace(tzinfo=timezone.utc)


def decide(
    expected_tasks: list[str],
    observations: list[ReplicaObservation],
    restarts: dict[str, int],
    max_restarts: int,
    cancel_requested: bool = False,
    restart_together: bool = False,
) -> Decision:
    if cancel_requested:
        return Decision(State.CANCELLED)
    if master_succeeded(observations):
        return Decision(State.SUCCEEDED)
    seen = {o.task_name: o for o in observations}

    failures: list[tuple[datetime, str, int | None]] = []
    to_restart = []
    for task in expected_tasks:
        observed = seen.get(task)
        if observed is None or observed.status == ReplicaStatus.MISSING:
            failures.append((_EPOCH, task, None))
            continue
        if observed.status != ReplicaStatus.EXITED or observed.exit_code == 0:
            continue
        if observed.exit_code in RETRYABLE_EXIT_CODES and restarts.get(task, 0) < max_restarts:
            to_restart.append(task)
        else:
            failures.append((observed.finished_at or _EPOCH, task, observed.exit_code))
    if failures:
        _, task, code = min(failures, key=lambda f: (f[0], expected_tasks.index(f[1])))
        error = seen[task].error if task in seen else ""
        return Decision(State.FAILED, failure_message(task, code, restarts.get(task, 0), error), task)
    if to_restart and restart_together:
        return Decision(restart=tuple(to_restart),
                        restart_alongside=tuple(task for task in expected_tasks if task not in to_restart))
    return Decision(restart=tuple(to_restart))

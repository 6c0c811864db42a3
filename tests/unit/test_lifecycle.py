"""The rule that turns replica states into a job state, table-tested."""

from datetime import datetime, timedelta, timezone

import pytest

from aiptrain.backends import ReplicaObservation, ReplicaStatus
from aiptrain.lifecycle import Decision, decide
from aiptrain.model import State
from aiptrain.topology import parse_task_name

TASKS = ["master-replica-0", "worker-replica-0", "worker-replica-1", "ps-replica-0"]
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def obs(task, status=ReplicaStatus.RUNNING, code=None, at=0):
    kind, index = parse_task_name(task)
    return ReplicaObservation(task, kind, index, status, code, T0 + timedelta(seconds=at) if code else None, task)


def running(*overrides):
    by_task = {o.task_name: o for o in overrides}
    return [by_task.get(t, obs(t)) for t in TASKS]


CASES = [
    ("all running", running(), {}, False, Decision()),
    ("master succeeded", running(obs("master-replica-0", ReplicaStatus.EXITED, 0)), {}, False, Decision(State.SUCCEEDED)),
    ("worker finished first", running(obs("worker-replica-0", ReplicaStatus.EXITED, 0)), {}, False, Decision()),
    (
        "worker failed",
        running(obs("worker-replica-1", ReplicaStatus.EXITED, 1)),
        {},
        False,
        Decision(State.FAILED, "The replica worker 1 exited with a non-zero status of 1.", "worker-replica-1"),
    ),
    (
        "master failed",
        running(obs("master-replica-0", ReplicaStatus.EXITED, 3)),
        {},
        False,
        Decision(State.FAILED, "The replica master 0 exited with a non-zero status of 3.", "master-replica-0"),
    ),
    ("worker killed: restart", running(obs("worker-replica-0", ReplicaStatus.EXITED, 137)), {}, False,
     Decision(restart=("worker-replica-0",))),
    ("ps terminated: restart", running(obs("ps-replica-0", ReplicaStatus.EXITED, 143)), {"ps-replica-0": 4}, False,
     Decision(restart=("ps-replica-0",))),
    (
        "restart budget spent",
        running(obs("worker-replica-0", ReplicaStatus.EXITED, 137)),
        {"worker-replica-0": 5},
        False,
        Decision(
            State.FAILED,
            "The replica worker 0 exited with a non-zero status of 137. It had been restarted 5 times already.",
            "worker-replica-0",
        ),
    ),
    ("cancel beats exit codes", running(obs("master-replica-0", ReplicaStatus.EXITED, 1)), {}, True, Decision(State.CANCELLED)),
    ("cancel beats success", running(obs("master-replica-0", ReplicaStatus.EXITED, 0)), {}, True, Decision(State.CANCELLED)),
    (
        "earliest failure is reported",
        running(obs("worker-replica-1", ReplicaStatus.EXITED, 2, at=1), obs("ps-replica-0", ReplicaStatus.EXITED, 1, at=0)),
        {},
        False,
        Decision(State.FAILED, "The replica ps 0 exited with a non-zero status of 1.", "ps-replica-0"),
    ),
    (
        "vanished container",
        [o for o in running() if o.task_name != "worker-replica-1"],
        {},
        False,
        Decision(State.FAILED, "The replica worker 1 disappeared: its container was removed.", "worker-replica-1"),
    ),
]


@pytest.mark.parametrize("observations, restarts, cancel, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(observations, restarts, cancel, expected):
    assert decide(TASKS, observations, restarts, max_restarts=5, cancel_requested=cancel) == expected


def test_error_log_tail_starts_at_the_last_traceback():
    from aiptrain.runner.groups import log_tail

    lines = [f"noise {i}" for i in range(50)] + ["Traceback (most recent call last):", "  File x", "    ^^^^", "ValueError: bad"]
    assert log_tail(lines) == lines[-4:]
    assert log_tail([f"line {i}" for i in range(30)]) == [f"line {i}" for i in range(10, 30)]

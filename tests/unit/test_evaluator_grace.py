"""Who waits at the end of a group: only the evaluators of a master that succeeded."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from aiptrain.backends import ReplicaObservation, ReplicaStatus
from aiptrain.lifecycle import awaited_at_end
from aiptrain.topology import parse_task_name


def obs(task: str, status: str, code: int | None = None) -> ReplicaObservation:
    task_type, index = parse_task_name(task)
    return ReplicaObservation(task, task_type, index, status, code, datetime.now(timezone.utc),
                              container_id=task)


@pytest.mark.parametrize(
    "observations, cancelling, awaited",
    [
        ([obs("master-replica-0", ReplicaStatus.EXITED, 0), obs("evaluator-replica-0", ReplicaStatus.RUNNING)], False, ["evaluator-replica-0"]),
        ([obs("master-replica-0", ReplicaStatus.EXITED, 0), obs("evaluator-replica-0", ReplicaStatus.RUNNING),
          obs("evaluator-replica-1", ReplicaStatus.EXITED, 0), obs("worker-replica-0", ReplicaStatus.RUNNING), obs("ps-replica-0", ReplicaStatus.RUNNING)],
         False, ["evaluator-replica-0"]),
        ([obs("master-replica-0", ReplicaStatus.EXITED, 0), obs("evaluator-replica-0", ReplicaStatus.RUNNING)], True, []),  # cancelled
        ([obs("master-replica-0", ReplicaStatus.EXITED, 1), obs("evaluator-replica-0", ReplicaStatus.RUNNING)], False, []),  # master failed
        ([obs("master-replica-0", ReplicaStatus.RUNNING), obs("evaluator-replica-0", ReplicaStatus.RUNNING)], False, []),  # still training
        ([obs("master-replica-0", ReplicaStatus.EXITED, 0), obs("worker-replica-0", ReplicaStatus.RUNNING)], False, []),  # no evaluator
    ],
)
def test_only_evaluators_of_a_successful_master_are_awaited(observations, cancelling, awaited):
    assert [o.task_name for o in awaited_at_end(observations, cancelling)] == awaited

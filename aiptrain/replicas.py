"""What the engine says about replicas, as values: a replica's status, one look at it, one line
of its output. A leaf module (the standard library only), so the pure rules (aiptrain.lifecycle)
read them without importing the backends that make them; aiptrain.backends re-exports them."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple


class ReplicaStatus(str, enum.Enum):
    """A replica's state, whatever the engine calls it (each backend maps its own in one table)."""

    CREATED = "created"  # made, not started yet
    RUNNING = "running"
    EXITED = "exited"
    MISSING = "missing"  # the engine no longer has it



@dataclass(frozen=True)
class ReplicaObservation:
    """What the engine says about one replica right now."""

    task_name: str
    task_type: str
    task_index: int
    status: ReplicaStatus
    exit_code: int | None = None
    finished_at: datetime | None = None
    container_id: str | None = None
    trial_id: str = ""  # the hyperparameter trial the replica belongs to; "" outside tuning jobs
    error: str = ""  # why the engine ended a replica that never ran (a swarm task rejected on its node)


class LogChunk(NamedTuple):  # a tuple: a million lines are a million of these
    time: str  # RFC 3339 with nanoseconds, as the engine stamps it
    stream: str  # stdout | stderr
    text: str  # one line, without its newline

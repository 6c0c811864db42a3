"""Backends turn a LaunchPlan into running replicas and report on them.

The supervisor and the CLI talk to this small interface only; `docker` is the one
backend today (one engine), and a Swarm or process backend fits the same shape.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Iterator, NamedTuple, Protocol

from aiptrain.planning import ContainerSpec, LaunchPlan

CREATED, RUNNING, EXITED, MISSING = "created", "running", "exited", "missing"


@dataclass(frozen=True)
class ReplicaObservation:
    """What the engine says about one replica right now."""

    task_name: str
    task_type: str
    task_index: int
    status: str  # created | running | exited | missing
    exit_code: int | None = None
    finished_at: datetime | None = None
    container_id: str | None = None
    trial_id: str = ""  # the hyperparameter trial the replica belongs to; "" outside tuning jobs


class LogChunk(NamedTuple):  # a tuple: a million lines are a million of these
    time: str  # RFC 3339 with nanoseconds, as the engine stamps it
    stream: str  # stdout | stderr
    text: str  # one line, without its newline


class Backend(Protocol):
    def host_address(self) -> str | None:
        """This host's address as seen from inside a replica, if the backend knows it."""

    def warm_up(self) -> None:
        """Get ready to be used soon (connect); never raises."""

    def check_ready(self, plan: LaunchPlan) -> None:
        """Raise EnvironmentNotReady if the plan cannot run here (no engine, image, GPU)."""

    def image_id(self, image: str) -> str:
        """The image's content ID: what an install for it is keyed by."""

    def run_to_completion(self, spec: ContainerSpec) -> tuple[int, str]:
        """Run a one-off container with no network and remove it; (exit status, output)."""

    def launch(self, plan: LaunchPlan) -> None:
        """Start every replica of the plan; on failure remove what was created and raise."""

    def observe(self, job_id: str) -> list[ReplicaObservation]: ...

    def restart(self, container_id: str) -> None:
        """Start a stopped replica again: same container, hostname and network."""

    def stop(self, container_ids: list[str], grace_seconds: int = 10) -> None:
        """SIGTERM, then SIGKILL after the grace period; replicas already gone are fine."""

    def remove(self, job_id: str, trial_id: str | None = None) -> None:
        """Remove the containers and networks of the job (of one trial only, when given);
        nothing if there are none."""

    def wait_for_changes(self, job_id: str, stop: threading.Event, changed: threading.Event) -> None:
        """Set `changed` whenever a replica starts or stops, until `stop` is set."""

    def follow_logs(self, container_id: str, since_ns: int | None = None) -> Iterator[list[LogChunk]]:
        """The replica's output from `since_ns` on, following until it stops, in batches of
        the lines that arrived together."""

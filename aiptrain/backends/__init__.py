"""Backends turn a LaunchPlan into running replicas and report on them.

The controller, the job verbs and the CLI see this small interface only, and get a backend
from `open_backend`, which imports the named one on first use: `docker` (one engine) and
`swarm` (a Docker Swarm cluster) run the same LaunchPlan. A job records which backend runs it.
Two protocols: `Backend`, what runs one job's replicas, and its `installation`, what the jobs
of the home share (the storage endpoint, shared networks) and the sweep, which the home's
controller owns.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from aiptrain.planning import ContainerSpec, LaunchPlan
from aiptrain.replicas import LogChunk as LogChunk
from aiptrain.replicas import ReplicaObservation as ReplicaObservation
from aiptrain.replicas import ReplicaStatus as ReplicaStatus
from aiptrain.settings import BACKEND_NAMES, Settings
from aiptrain.storage.endpoint import StorageEndpoint

# The replicas' value types (LogChunk, ReplicaObservation, ReplicaStatus) live in aiptrain.replicas,
# a leaf module the pure rules read without the backends; imported from here as well.

# name -> (module, class); every class has `from_settings(settings)`.
_BACKEND_CLASSES = {
    "docker": ("aiptrain.backends.docker", "DockerBackend"),
    "swarm": ("aiptrain.backends.swarm", "SwarmBackend"),
}
assert set(_BACKEND_CLASSES) <= set(BACKEND_NAMES)


@dataclass(frozen=True)
class ImageInfo:
    """What the engine says of an image a submit runs: asked once per submit (`inspect_image`),
    then handed to whatever needs it (the runtime's freshness and contents, the readiness check,
    the install's key)."""

    id: str  # the content ID: what an install for it is keyed by
    labels: Mapping[str, str] = field(default_factory=dict)


class Installation(Protocol):
    """What the jobs of one installation share on a backend's engine, and what no job removes:
    the home's controller owns it (warm-up for launching, release when it goes, the sweep).
    A submit asks it too, to start the storage endpoint ahead of the launch."""

    def warm_up(self, launches: bool = False) -> None:
        """Get ready to be used soon (connect); never raises. `launches`: this process launches
        the installation's jobs from now on (the controller), so what makes a launch faster may
        be kept ready."""

    def ensure_storage_endpoint(self, endpoint: StorageEndpoint) -> str:
        """Start the installation's storage endpoint unless it runs already (its files made
        first: `StorageEndpoint.prepare_files`); the address replicas reach it at."""

    def release_shared(self, still_needed: Callable[[], bool]) -> None:
        """Remove what the installation's jobs share (the storage endpoint and its network)
        unless `still_needed()` says a job still is active, asked under the locks a launch
        takes to make them; the next launch makes them again."""

    def remove_installation(self) -> None:
        """Remove everything the installation shares (the storage endpoint, the lone replicas'
        network): its home is gone, so nothing will use them again."""

    def remove_abandoned(self, active_jobs: Callable[[], Collection[str]] | None = None) -> None:
        """Remove what installations whose home was deleted from this host left shared on the
        engine (their storage endpoint, their lone replicas' network), where nothing uses it;
        given `active_jobs` (this home's active job IDs, asked after the engine was looked at),
        also the networks of this home's ended jobs that the engine kept at their teardown."""


class Backend(Protocol):
    """What runs one job's replicas: the job verbs, the driver and the log copier use it."""

    name: str  # as --backend and the job store call it
    # Whether a directory of this host, bind-mounted, is the same directory in every replica
    # (one engine), so the packages can be installed once for all of them (aiptrain.installs).
    host_dirs_reach_replicas: bool
    # What the installation's jobs share on the same engine, through the same connection (the
    # launches use it: the storage endpoint, the lone replicas' network).
    installation: Installation

    def host_address(self) -> str | None:
        """This host's address as seen from inside a replica, if the backend knows it."""

    def check_ready(self, plan: LaunchPlan, present: Collection[str] = ()) -> None:
        """Raise EnvironmentNotReady if the plan cannot run here (no engine, image, GPU); the
        images in `present` were inspected by the caller and are not asked about again."""

    def inspect_image(self, image: str) -> ImageInfo | None:
        """The image as the engine has it; None when it has no image of that name."""

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

    def watch(self, stop: threading.Event, on_change: Callable[[str], None]) -> None:
        """Call `on_change(job_id)` whenever a replica of the installation starts or stops,
        until `stop` is set (the controller runs one watcher per backend)."""

    def follow_logs(self, container_id: str, since_ns: int | None = None) -> Iterator[list[LogChunk]]:
        """The replica's output from `since_ns` on, following until it stops, in batches of
        the lines that arrived together."""


def open_backend(settings: Settings, name: str | None = None) -> Backend:
    """The backend called `name` (default: AIPTRAIN_BACKEND, else docker) for this home.
    Cheap: backends connect to their engine on first use."""
    name = name or settings.backend
    module, class_name = _BACKEND_CLASSES[name]
    return getattr(importlib.import_module(module), class_name).from_settings(settings)

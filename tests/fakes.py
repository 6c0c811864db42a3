"""A fake backend for tests of what drives replicas (the controller, the job verbs, the client),
where the engine itself is not what is tested. In the manner of Kubeflow's MockContainerAdapter:
it records every call, keeps replicas per (job, trial, task) and makes them exit as the test
scripts them, on a step counter the test advances (never a sleep).

    backend = FakeBackend(script={"master-replica-0": [137, 0]}, logs={"master-replica-0": ["hello"]})
    backend.launch(plan)
    backend.advance()   # master-replica-0 exits 137 (its first run)
    backend.restart(backend.container_id("job", "master-replica-0"))
    backend.advance()   # it exits 0 (its second run)

A task without a scripted exit for its current run keeps running until stopped. Every change
(launch, exit, restart, stop, remove) calls the callbacks of `watch` at once, in the changing
thread, and sets `changed`. What the home's jobs share is the backend's `installation`, a
FakeInstallation that records its own calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from aiptrain.backends import Backend, ImageInfo, Installation, LogChunk, ReplicaObservation, ReplicaStatus
from aiptrain.errors import AiptrainError
from aiptrain.logs import parse_engine_time
from aiptrain.planning import ContainerSpec, LaunchPlan
from aiptrain.settings import Settings
from aiptrain.topology import MASTER_TASK, parse_task_name

# The fake's clock: step n is EPOCH + n seconds (log lines and exits are stamped with it).
EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
SIGTERM_EXIT = 143  # what a replica stopped by `stop` exits with (128 + SIGTERM)

# A task's scripted log: lines (each its own stdout batch) or batches of LogChunk.
LogScript = list[str] | list[list[LogChunk]]


def stamp(step: int, run: int = 1, line: int = 0) -> str:
    """The engine's RFC 3339 time of a log line: the step's second; the run and the line in its
    nanoseconds, so a restarted replica's lines come after its earlier run's."""
    moment = EPOCH + timedelta(seconds=step)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{run:03d}{line + 1:06d}Z"


def plan_of(job_id: str, *task_names: str, trial_id: str | None = None) -> LaunchPlan:
    """A launch plan of the named replicas (default: the master alone), enough for the fake."""
    specs = []
    for task_name in task_names or (MASTER_TASK,):
        task_type, index = parse_task_name(task_name)
        specs.append(ContainerSpec(name=f"{job_id}-{task_type}-{index}", hostname=f"{task_type}-{index}",
                                   task_name=task_name, task_type=task_type, task_index=index, image="fake",
                                   entrypoint=None, command=[], env={}, mounts=(), labels={}, user="1000"))
    return LaunchPlan(job_id=job_id, network=None, containers=tuple(specs), trial_id=trial_id)


@dataclass
class FakeReplica:
    job_id: str
    trial_id: str  # "" outside tuning jobs
    spec: ContainerSpec
    container_id: str
    status: ReplicaStatus = ReplicaStatus.RUNNING
    exit_code: int | None = None
    finished_at: datetime | None = None
    runs: int = 1  # how many times it started: the index (+1) into its script
    started_steps: list[int] = field(default_factory=list)

    def observation(self) -> ReplicaObservation:
        spec = self.spec
        return ReplicaObservation(spec.task_name, spec.task_type, spec.task_index, self.status,
                                  exit_code=self.exit_code, finished_at=self.finished_at,
                                  container_id=self.container_id, trial_id=self.trial_id)


class FakeInstallation:
    """Every member of aiptrain.backends.Installation (tests/unit/test_backends.py compares the
    signatures): it records what it was asked in `calls`, as the backend does in its own.

    fail: member name -> the AiptrainError that member raises (the backend's `fail`, shared).
    """

    def __init__(self, fail: dict[str, Exception] | None = None):
        self.fail = fail if fail is not None else {}
        self.calls: list[tuple] = []
        self.released = 0  # release_shared calls that released

    def calls_to(self, member: str) -> list[tuple]:
        return [call for call in self.calls if call[0] == member]

    def warm_up(self, launches: bool = False) -> None:
        self.calls.append(("warm_up",))

    def ensure_storage_endpoint(self, endpoint) -> str:
        self.calls.append(("ensure_storage_endpoint", endpoint.name))
        self._maybe_fail("ensure_storage_endpoint")
        endpoint.prepare_files()  # as a real installation does, before it starts the endpoint
        return "192.0.2.1"  # TEST-NET-1: an address nothing answers at

    def remove_installation(self) -> None:
        self.calls.append(("remove_installation",))

    def remove_abandoned(self, active_jobs: Callable[[], Collection[str]] | None = None) -> None:
        self.calls.append(("remove_abandoned", None if active_jobs is None else sorted(active_jobs())))

    def release_shared(self, still_needed: Callable[[], bool]) -> None:
        self.calls.append(("release_shared",))
        self._maybe_fail("release_shared")
        if not still_needed():
            self.released += 1

    def _maybe_fail(self, member: str) -> None:
        error = self.fail.get(member)
        if error is not None:
            raise error


class FakeBackend:
    """Every member of aiptrain.backends.Backend (tests/unit/test_backends.py compares the
    signatures), with replicas in memory.

    script: task name (or "trial/task" for one trial's) -> the exit codes of its successive
      runs, taken one per `advance()`; missing or used up: the run goes on until stopped.
    logs: task name (or "trial/task") -> what `follow_logs` yields for each of its runs.
    hold_logs: `follow_logs` waits for `release_logs(n)` before each batch, so a test decides
      when output arrives.
    fail: member name -> the AiptrainError that member raises (e.g. {"launch": ...}).
    images: image name -> what `inspect_image` answers (None: the engine lacks it); an image not
      named is there, its ID derived from its name (or taken from `image_ids`), with no labels.
    """

    name = "fake"
    host_dirs_reach_replicas = True

    @classmethod
    def from_settings(cls, settings: Settings) -> FakeBackend:
        return cls()

    def __init__(self, *, name: str = "fake", script: dict[str, list[int]] | None = None,
                 logs: dict[str, LogScript] | None = None, hold_logs: bool = False,
                 fail: dict[str, Exception] | None = None, image_ids: dict[str, str] | None = None,
                 images: dict[str, ImageInfo | None] | None = None, address: str | None = "192.0.2.1", host_dirs_reach_replicas: bool = True):
        self.name = name
        self.host_dirs_reach_replicas = host_dirs_reach_replicas
        self.script = {key: list(codes) for key, codes in (script or {}).items()}
        self.logs = dict(logs or {})
        self.fail = dict(fail or {})
        self.image_ids = dict(image_ids or {})
        self.images = dict(images or {})
        self.address = address
        self.step = 0
        self.replicas: dict[str, FakeReplica] = {}  # container id -> replica
        # What was asked of it, in order: (member, argument...) tuples.
        self.calls: list[tuple] = []
        self.launched: list[LaunchPlan] = []
        self.stopped: list[str] = []  # container ids
        self.restarted: list[str] = []
        self.removed: list[tuple[str, str | None]] = []  # (job, trial or None)
        self.ran: list[ContainerSpec] = []  # run_to_completion's containers
        self.run_result: tuple[int, str] = (0, "")
        self.installation = FakeInstallation(self.fail)  # what the home's jobs share: its own calls
        self.changed = threading.Event()
        self.watching = threading.Event()  # set once a `watch` is registered
        self._watchers: list[Callable[[str], None]] = []
        self._lock = threading.RLock()
        self._log_gate = threading.Semaphore(0) if hold_logs else None
        self._log_taken = threading.Semaphore(0)
        self._next_id = 0

    # -- what the test drives ---------------------------------------------------------------------

    def advance(self, steps: int = 1) -> None:
        """Move the clock: at each step every running replica with a scripted exit for its
        current run exits with it."""
        for _ in range(steps):
            with self._lock:
                self.step += 1
                exits = {r.container_id: self._scripted_exit(r) for r in self.replicas.values()
                         if r.status is ReplicaStatus.RUNNING}
                exiting = [self.replicas[cid] for cid, code in exits.items() if code is not None]
                for replica in exiting:
                    self._exit(replica, exits[replica.container_id] or 0)
            for replica in exiting:
                self._notify(replica.job_id)

    def container_id(self, job_id: str, task_name: str, trial_id: str = "") -> str:
        """The id of a launched replica."""
        return self.replica(job_id, task_name, trial_id).container_id

    def replica(self, job_id: str, task_name: str, trial_id: str = "") -> FakeReplica:
        return next(r for r in self.replicas.values()
                    if (r.job_id, r.trial_id, r.spec.task_name) == (job_id, trial_id, task_name))

    def exit(self, job_id: str, task_name: str, code: int, trial_id: str = "") -> None:
        """End one running replica now with `code`, whatever its script says."""
        replica = self.replica(job_id, task_name, trial_id)
        with self._lock:
            self._exit(replica, code)
        self._notify(job_id)

    def vanish(self, job_id: str, task_name: str, trial_id: str = "") -> None:
        """The engine loses the replica (removed behind aiptrain's back)."""
        replica = self.replica(job_id, task_name, trial_id)
        with self._lock:
            del self.replicas[replica.container_id]
        self._notify(job_id)

    def release_logs(self, batches: int = 1, wait: bool = True) -> None:
        """Let `follow_logs` yield `batches` more batches (hold_logs=True); with `wait`, return once
        the follower has taken each (asked for the one after it: it has written it)."""
        assert self._log_gate is not None, "FakeBackend(hold_logs=True) holds logs back"
        for _ in range(batches):
            self._log_gate.release()
            if wait:
                assert self._log_taken.acquire(timeout=60), "nobody follows the logs"

    def calls_to(self, member: str) -> list[tuple]:
        return [call for call in self.calls if call[0] == member]

    # -- the Backend protocol ------------------------------------------------------------------

    def host_address(self) -> str | None:
        self.calls.append(("host_address",))
        return self.address

    def check_ready(self, plan: LaunchPlan, present: Collection[str] = ()) -> None:
        self.calls.append(("check_ready", plan.job_id, tuple(present)))
        self._maybe_fail("check_ready")

    def inspect_image(self, image: str) -> ImageInfo | None:
        self.calls.append(("inspect_image", image))
        self._maybe_fail("inspect_image")
        if image in self.images:
            return self.images[image]
        return ImageInfo(self.image_ids.get(image, "sha256:" + image.encode().hex()[:64].ljust(64, "0")))

    def run_to_completion(self, spec: ContainerSpec) -> tuple[int, str]:
        self.calls.append(("run_to_completion", spec.name))
        self._maybe_fail("run_to_completion")
        self.ran.append(spec)
        return self.run_result

    def launch(self, plan: LaunchPlan) -> None:
        self.calls.append(("launch", plan.job_id, plan.trial_id))
        self._maybe_fail("launch")
        with self._lock:
            self.launched.append(plan)
            for spec in plan.containers:
                self._next_id += 1
                container_id = f"fake{self._next_id:060d}"
                self.replicas[container_id] = FakeReplica(plan.job_id, plan.trial_id or "", spec, container_id,
                                                          started_steps=[self.step])
        self._notify(plan.job_id)

    def observe(self, job_id: str) -> list[ReplicaObservation]:
        self.calls.append(("observe", job_id))
        self._maybe_fail("observe")
        with self._lock:
            return [r.observation() for r in self.replicas.values() if r.job_id == job_id]

    def restart(self, container_id: str) -> None:
        self.calls.append(("restart", container_id))
        self._maybe_fail("restart")
        with self._lock:
            replica = self.replicas.get(container_id)
            if replica is None:
                raise AiptrainError(f"No such container: {container_id}")
            self.restarted.append(container_id)
            replica.status, replica.exit_code, replica.finished_at = ReplicaStatus.RUNNING, None, None
            replica.runs += 1
            replica.started_steps.append(self.step)
        self._notify(replica.job_id)

    def stop(self, container_ids: list[str], grace_seconds: int = 10) -> None:
        self.calls.append(("stop", tuple(container_ids), grace_seconds))
        self._maybe_fail("stop")
        jobs = []
        with self._lock:
            for container_id in container_ids:
                self.stopped.append(container_id)
                replica = self.replicas.get(container_id)
                if replica is not None and replica.status is ReplicaStatus.RUNNING:
                    self._exit(replica, SIGTERM_EXIT)
                    jobs.append(replica.job_id)
        for job_id in dict.fromkeys(jobs):
            self._notify(job_id)

    def remove(self, job_id: str, trial_id: str | None = None) -> None:
        self.calls.append(("remove", job_id, trial_id))
        self.removed.append((job_id, trial_id))
        with self._lock:
            gone = [cid for cid, r in self.replicas.items()
                    if r.job_id == job_id and (trial_id is None or r.trial_id == trial_id)]
            for container_id in gone:
                del self.replicas[container_id]
        self._maybe_fail("remove")  # after removing the replicas: as an engine that keeps a network
        if gone:
            self._notify(job_id)

    def watch(self, stop: threading.Event, on_change: Callable[[str], None]) -> None:
        """Deliver every change to `on_change` (in the thread that makes it) until `stop` is set;
        blocks like the real watchers, so run it in a thread."""
        self.calls.append(("watch",))
        with self._lock:
            self._watchers.append(on_change)
        self.watching.set()
        stop.wait()
        with self._lock:
            self._watchers.remove(on_change)

    def follow_logs(self, container_id: str, since_ns: int | None = None) -> Iterator[list[LogChunk]]:
        """The scripted output of the replica's current run, one batch at a time, from `since_ns`."""
        self.calls.append(("follow_logs", container_id, since_ns))
        self._maybe_fail("follow_logs")
        with self._lock:
            replica = self.replicas.get(container_id)
            if replica is None:
                raise AiptrainError(f"No such container: {container_id}")
            batches = self._batches(replica)
        for batch in batches:
            batch = [chunk for chunk in batch if since_ns is None or parse_engine_time(chunk.time) > since_ns]
            if not batch:
                continue
            if self._log_gate is not None:
                self._log_gate.acquire()
            yield batch
            self._log_taken.release()

    # -- inside --------------------------------------------------------------------------------

    def _script_for(self, table: dict, replica: FakeReplica):
        return table.get(f"{replica.trial_id}/{replica.spec.task_name}", table.get(replica.spec.task_name))

    def _scripted_exit(self, replica: FakeReplica) -> int | None:
        codes = self._script_for(self.script, replica) or []
        return codes[replica.runs - 1] if replica.runs <= len(codes) else None

    def _batches(self, replica: FakeReplica) -> list[list[LogChunk]]:
        script = self._script_for(self.logs, replica) or []
        step = replica.started_steps[-1]
        return [[LogChunk(stamp(step, replica.runs, i), "stdout", item)] if isinstance(item, str) else list(item)
                for i, item in enumerate(script)]

    def _exit(self, replica: FakeReplica, code: int) -> None:
        replica.status, replica.exit_code = ReplicaStatus.EXITED, code
        replica.finished_at = EPOCH + timedelta(seconds=self.step)

    def _notify(self, job_id: str) -> None:
        self.changed.set()
        with self._lock:
            watchers = list(self._watchers)
        for on_change in watchers:
            on_change(job_id)

    def _maybe_fail(self, member: str) -> None:
        error = self.fail.get(member)
        if error is not None:
            raise error


if TYPE_CHECKING:  # mypy checks that the fakes are a Backend and an Installation, member by member
    _: Backend = FakeBackend()
    _installation: Installation = FakeInstallation()

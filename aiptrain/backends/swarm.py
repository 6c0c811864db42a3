"""The Swarm backend: the same LaunchPlan on a Docker Swarm, whose nodes may be several machines.

Each replica is a `replicated` service of one task with no restart policy (aiptrain's own rule
restarts a replica killed by a signal: `restart` runs a new task with a forced update),
on the job's attachable overlay network with a subnet from AIPTRAIN_SUBNET_POOL. A replica's
service carries its hostname as a network alias and resolves by DNS round robin (no virtual IP),
so the names in TF_CONFIG reach the task itself; labels, env, user and working dir are the plan's.
A replica is stopped by scaling its service to zero (SIGTERM, then SIGKILL after the grace
period); its service and logs stay until the job is removed. Not `replicated-job` services,
although they fit "run once" better: Docker 20.10 keeps the tasks of removed job services, so
their containers stay on every node but this one (and removing a running one leaves its task
running, moby/moby#44312).

What a bind mount would carry on one engine travels otherwise here, because the other nodes do
not share this host's disk:
- Read-only files (the job's packages and their wheelhouse, credentials) become Swarm configs,
  one per file, mounted at the same paths: the managers hand them to any node, no registry
  needed. A config holds less than 1,024,000 bytes; a bigger file is refused at submit.
- So the packages are installed by each replica when it starts (`pip install --user`, offline,
  from the mounted files), not once on this host (aiptrain.installs works on one engine only).
- Writable directories (a local job dir, a trial's metrics) stay bind mounts: on a swarm of
  several nodes they must be mounted at the same path on every node and listed in
  AIPTRAIN_SWARM_SHARED_DIRS, else the submit is refused. gs:// job dirs just work.

gs:// kept on this machine reaches replicas as on the docker backend (aiptrain.storage.endpoint),
through a storage endpoint of the job's own: a service of one task, placed on this manager node
(where $AIPTRAIN_HOME/gcs is, bind-mounted into it), on the job's network under Google's API host
names as network aliases, so those names resolve to it on any node; a lone replica that reaches
gs:// gets a network of its own for it. Its CA bundle and gsutil/gcloud travel as configs like
the packages. Started by the job's launch before its replicas, it carries the job's labels and
goes with the job's services. Not one endpoint for every job (as releases before had it): its
network joined the replicas of every job, so one could reach another's ports. Not that one
endpoint attached to each job's network either: adding a network to a service replaces its task
(every running job would lose gs:// for a moment), and Docker 20.10 refuses to connect a task's
container to another overlay ("network not found"). The cost: a service more per job (a second
or two of its launch, started while the replicas' configs are made).

Machine types are not reserved: while replicas were job-mode services, Docker 20.10's swarm kept
the last task of every removed one and counted its reservation, so after a few jobs every task
that reserved CPUs or memory was rejected ("assigned node no longer meets constraints"). Tasks of
replicated services go with them, so reservations could return (not done yet). Replicas spread
over the nodes by Swarm's default strategy; --limit-resources still caps each one.
Accelerators are reserved as the `NVIDIA-GPU` generic resource (how a GPU
node hands GPUs to a task), and a job whose GPUs no nodes hold is refused at submit instead of
pending forever.

Security as on the docker backend where Swarm (API 1.41) allows it: the host user's uid (nobody
for root), every capability dropped, an init process, the pids limit. Swarm has no
no-new-privileges, and its tmpfs mounts are noexec (packages with compiled parts installed in
/tmp would not load), so the root filesystem stays writable; it goes with the task's container.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from aiptrain.backends import ImageInfo, LogChunk, ReplicaObservation, ReplicaStatus
from aiptrain.backends.engine import DEFAULT_NETWORK, Engine, EngineApi, each, removed_on_failure
from aiptrain.backends.engine_logs import body_blocks, frame_blocks, log_frames, open_logs, read_log_lines
from aiptrain.backends.holders import Holders
from aiptrain.backends.networks import NETWORK_PATIENCE_SECONDS, Networks
from aiptrain.backends.swarm_endpoint import SwarmInstallation, SwarmStorage
from aiptrain.backends.swarm_specs import (
    CONFIG_NAME_MAX,
    NOT_A_MANAGER,
    Node,
    carried_files,
    check_gpus,
    config_reference,
    latest_task,
    meets,
    node_capacity,
    observation,
    plan_mounts,
    replica_status,
    service_spec,
    short_name,
    unshared_dirs,
)
from aiptrain.backends.sweep import Sweep
from aiptrain.errors import AiptrainError, EnvironmentNotReady, ValidationError
from aiptrain.labels import LABEL_INSTALLATION, LABEL_JOB, LABEL_ROLE, LABEL_TRIAL
from aiptrain.planning import ContainerSpec, LaunchPlan, NetworkSpec
from aiptrain.settings import DEFAULT_SUBNET_POOL, Settings

# A job's overlay subnet holds its replicas, one load-balancer address per node, and a few spare
# for tasks re-run while their predecessor still holds its address.
SPARE_ADDRESSES = 4
UPDATE_ATTEMPTS = 10  # a service updated by two processes at once: the later one tries again
RESTART_PATIENCE_SECONDS = 30  # for the orchestrator to make a re-run task
STOP_PATIENCE_SECONDS = 10  # beyond the grace period, for the node to report a stopped task
LOG_QUIET_SECONDS = 0.3  # a follow ends once the task has ended and its output is this quiet
TASK_CHECK_SECONDS = 0.5
LOGS_PATH = "/services/{0}/logs"  # the engine's log endpoint of one replica's service


class SwarmBackend:
    """A Docker Swarm through one of its managers (DOCKER_HOST, or this host's engine). It holds
    what the docker backend holds, not the docker backend: the engine handle (the connection,
    label filters, removing the containers this node still keeps, engine events), the job
    networks (attachable overlays from the same subnet pool), and the log line assembly."""

    name = "swarm"
    host_dirs_reach_replicas = False

    def __init__(self, installation_id: str | None = None, client: EngineApi = None,
                 subnet_pool: str = DEFAULT_SUBNET_POOL, shared_dirs: tuple[str, ...] = (),
                 constraints: tuple[str, ...] = (), stop_grace_seconds: int = 10, home: str | None = None):
        self.engine = Engine(installation_id, client, home)
        self.networks = Networks(self.engine, subnet_pool, {"driver": "overlay", "attachable": True})
        self.storage = SwarmStorage(self.engine, self.networks)
        # This manager's own engine may hold what the docker backend's installation shares there.
        sweep = Sweep(self.engine, self.networks, Holders(self.engine))
        self.installation = SwarmInstallation(self.engine, self.storage, sweep)
        self.networks.free_pool = self.installation.remove_abandoned
        self._shared_dirs = shared_dirs
        self._constraints = constraints
        self._stop_grace_seconds = stop_grace_seconds

    @classmethod
    def from_settings(cls, settings: Settings) -> SwarmBackend:
        return cls(settings.installation_id, subnet_pool=settings.subnet_pool, shared_dirs=settings.swarm_shared_dirs,
                   constraints=settings.swarm_constraints, stop_grace_seconds=settings.stop_grace_seconds,
                   home=str(settings.home))

    # -- readiness -----------------------------------------------------------------------

    @property
    def api(self) -> EngineApi:
        return self.engine.api

    def host_address(self) -> str | None:
        return self.engine.host_address()

    def inspect_image(self, image: str) -> ImageInfo | None:
        return self.engine.inspect_image(image)

    def run_to_completion(self, spec: ContainerSpec) -> tuple[int, str]:
        """A one-off container on this manager's engine (no network) and removed; (status, output)."""
        return self.engine.run_to_completion(spec)

    def check_ready(self, plan: LaunchPlan, present: Collection[str] = ()) -> None:
        swarm = self.api.info().get("Swarm") or {}
        if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
            raise EnvironmentNotReady(NOT_A_MANAGER)
        self.networks.check_pool()
        self.engine.check_images(plan, " (every node of the swarm needs it)", present)
        self._check_mounts(plan, len(self.api.nodes()))
        check_gpus(plan.containers, self._nodes())

    def _check_mounts(self, plan: LaunchPlan, node_count: int) -> None:
        mounts = plan_mounts(plan)
        carried_files(mounts)
        unshared = unshared_dirs(mounts, self._shared_dirs) if node_count > 1 else []
        if unshared:
            raise ValidationError(
                f"The replicas would write to [{unshared[0]}], a directory of this machine that the other nodes of "
                f"the swarm ({node_count} nodes) do not see: use a gs:// --job-dir, or mount it at the same path "
                "on every node and list it in AIPTRAIN_SWARM_SHARED_DIRS."
            )

    def _nodes(self) -> list[Node]:
        """The nodes that take the replicas now: ready, active, and meeting the constraints."""
        return [node_capacity(n) for n in self.api.nodes()
                if n["Status"]["State"] == "ready" and n["Spec"].get("Availability") == "active"
                and all(meets(n, c) for c in self._constraints)]

    # -- launch --------------------------------------------------------------------------

    def launch(self, plan: LaunchPlan) -> None:
        with removed_on_failure(plan, self.remove):
            nodes = self._nodes()
            check_gpus(plan.containers, nodes)
            network = job_network(plan)
            if network:
                extra = len(nodes) + SPARE_ADDRESSES + (1 if plan.storage else 0)  # and the job's endpoint
                self.networks.create(dataclasses.replace(network, addresses=network.addresses + extra))
            if plan.storage and network:  # serving before any replica starts, as on the docker backend
                self.storage.start_for_job(plan.storage, network.name, network.labels)
            configs = self._create_configs(plan)
            each(lambda spec: self._create_service(plan, spec, configs, network), plan.containers)

    def _create_configs(self, plan: LaunchPlan) -> dict[str, tuple[str, str]]:
        """One config per carried file: path in the replicas -> (config ID, config name)."""
        files = carried_files(plan_mounts(plan))
        # Named and labelled as the job's network, or as its lone replica when it has none.
        base = short_name(plan.network.name if plan.network else plan.containers[0].name, CONFIG_NAME_MAX - 6)
        labels = plan.network.labels if plan.network else plan.containers[0].labels
        created: dict[str, tuple[str, str]] = {}

        def create(item: tuple[int, tuple[Path, str]]) -> None:
            index, (path, target) = item
            name = f"{base}-{index}"
            config = self.api.create_config(name, path.read_bytes(), labels=labels)
            created[target] = (config["ID"], name)

        each(create, list(enumerate(files)))
        return created

    def _create_service(self, plan: LaunchPlan, spec: ContainerSpec, configs: dict[str, tuple[str, str]],
                        network: NetworkSpec | None) -> None:
        carried = {target: path for path, target in carried_files(spec.mounts)}
        references = [config_reference(*configs[target], target, spec.user, os.access(carried[target], os.X_OK))
                      for target in sorted(carried)]
        self.api.create_service(**service_spec(spec, plan.environment(spec), network.name if network else None,
                                               references, self._constraints, self._stop_grace_seconds))

    # -- observation ---------------------------------------------------------------------

    def _services(self, job_id: str, trial_id: str | None = None) -> list[dict]:
        """The job's services: its replicas' and its storage endpoint's (LABEL_ROLE)."""
        return self.api.services(filters={"label": self.engine.job_labels(job_id, trial_id)})

    def _replica_services(self, job_id: str) -> list[dict]:
        return [s for s in self._services(job_id) if LABEL_ROLE not in (s["Spec"].get("Labels") or {})]

    def observe(self, job_id: str) -> list[ReplicaObservation]:
        services = self._replica_services(job_id)
        if not services:
            return []
        tasks: dict[str, list[dict]] = {}
        for task in self.api.tasks(filters={"service": [s["ID"] for s in services]}):
            tasks.setdefault(task["ServiceID"], []).append(task)
        return [observation(s, latest_task(tasks.get(s["ID"], []))) for s in services]

    def _latest_task(self, service_id: str) -> dict | None:
        return latest_task(self.api.tasks(filters={"service": service_id}))

    # -- control -------------------------------------------------------------------------

    def restart(self, container_id: str) -> None:
        """Run the replica's service again (a forced update replaces its task): same name, hostname,
        network and configs, a new task. Returns once the new task exists, so that the next
        observation (and log follow) sees it rather than the one that ended."""
        ended = self._latest_task(container_id)
        self._scale(container_id, replicas=1, force=True)
        deadline = time.monotonic() + RESTART_PATIENCE_SECONDS
        while time.monotonic() < deadline:
            task = self._latest_task(container_id)
            if task and (ended is None or task["ID"] != ended["ID"]):
                return
            time.sleep(0.1)
        raise AiptrainError(f"Swarm did not re-run the replica's service {container_id[:12]} within "
                            f"{RESTART_PATIENCE_SECONDS} s: see `docker service ps {container_id[:12]}`.")

    def _scale(self, service_id: str, replicas: int, force: bool = False) -> None:
        """Update a replica's service: `replicas` 0 stops its task (SIGTERM, then SIGKILL after the
        grace period set at launch), 1 with `force` runs a new one. Another process (a cancel
        beside the supervisor) may update the same service at the same moment: the engine then
        refuses the stale version, and the update is made again on the current one."""
        from docker.errors import APIError

        for attempt in range(UPDATE_ATTEMPTS):
            try:
                return self._update_replicas(service_id, replicas, force)
            except APIError as exc:
                if "update out of sequence" not in str(exc) or attempt == UPDATE_ATTEMPTS - 1:
                    raise
                time.sleep(0.05)

    def _update_replicas(self, service_id: str, replicas: int, force: bool) -> None:
        service = self.api.inspect_service(service_id)
        if not force and ((service["Spec"].get("Mode") or {}).get("Replicated") or {}).get("Replicas") == replicas:
            return  # stopped already, by the other process
        spec = service["Spec"]
        template = spec["TaskTemplate"]
        if force:
            template["ForceUpdate"] = template.get("ForceUpdate", 0) + 1
        self.api.update_service(service_id, service["Version"]["Index"], task_template=template, name=spec["Name"],
                                labels=spec.get("Labels"), endpoint_spec=spec.get("EndpointSpec"),
                                mode={"Replicated": {"Replicas": replicas}})

    def stop(self, container_ids: list[str], grace_seconds: int = 10) -> None:
        """Stop the replicas' tasks and wait (up to the grace period, and a little) until they
        have ended; their services stay, with their logs, until the job is removed."""
        from docker.errors import NotFound

        def stop_one(service_id: str) -> None:
            try:
                self._scale(service_id, replicas=0)
            except NotFound:
                return
            deadline = time.monotonic() + grace_seconds + STOP_PATIENCE_SECONDS
            while not self._task_ended(service_id) and time.monotonic() < deadline:
                time.sleep(0.2)

        each(stop_one, container_ids)

    def remove(self, job_id: str, trial_id: str | None = None) -> None:
        """Tasks stopped, services removed, then what this node still keeps of their containers
        and the network (the docker backend's removal, waiting while the network is in use),
        then the configs, which no service uses any more."""
        from docker.errors import NotFound

        def remove_service(service: dict) -> None:
            try:
                if replica_status(service, self._latest_task(service["ID"])) != ReplicaStatus.EXITED:
                    self._scale(service["ID"], replicas=0)  # its task gets the grace period
                self.api.remove_service(service["ID"])
            except NotFound:
                pass

        def remove_config(config: dict) -> None:
            try:
                self.api.remove_config(config["ID"])
            except NotFound:
                pass

        each(remove_service, self._services(job_id, trial_id))
        containers = self.engine.leftover_containers(job_id, trial_id)
        self.engine.remove_replicas(containers, keep_networks={DEFAULT_NETWORK, self.networks.solo_network_name})
        self.networks.remove_job_networks(job_id, trial_id)
        self._wait_networks_gone(job_id, trial_id)
        each(remove_config, self.api.configs(filters={"label": self.engine.job_labels(job_id, trial_id)}))

    def _wait_networks_gone(self, job_id: str, trial_id: str | None) -> None:
        """Until the swarm no longer lists the job's removed networks: it removes an overlay once
        the tasks on it (its storage endpoint's, say) have shut down, a moment after the removal
        was accepted; a job is torn down when nothing of it is left."""
        deadline = time.monotonic() + NETWORK_PATIENCE_SECONDS
        while self.api.networks(filters={"label": self.engine.job_labels(job_id, trial_id)}):
            if time.monotonic() > deadline:
                raise AiptrainError(f"The swarm keeps the networks of job [{job_id}] after their removal: see "
                                    "`docker network ls`; the sweep removes them later.")
            time.sleep(0.2)

    def watch(self, stop: threading.Event, on_change: Callable[[str], None]) -> None:
        """The engine's container events of this manager's node (aiptrain.backends.engine)."""
        self.engine.watch(stop, on_change)

    # -- logs ----------------------------------------------------------------------------

    def follow_logs(self, container_id: str, since_ns: int | None = None) -> Iterator[list[LogChunk]]:
        """The replica's output from `since_ns` on, until its task has ended: a service's log
        follow never ends by itself (a job's service outlives its task), so it is ended here once
        the task has ended and its output is quiet, and then read once more plainly."""
        yield from read_log_lines(functools.partial(self._log_frames, container_id), since_ns, read_again=True)

    def _log_frames(self, replica_id: str, since_ns: int | None,
                    follow: bool) -> Iterator[list[tuple[int, bytes]]]:
        if not follow:
            yield from log_frames(self.api, LOGS_PATH, replica_id, since_ns, follow)
            return
        response = open_logs(self.api, LOGS_PATH, replica_id, since_ns, follow=True)
        batches: queue.Queue = queue.Queue()
        reader = threading.Thread(target=_pump, args=(response, batches), daemon=True)
        reader.start()
        ended, next_check = False, 0.0
        try:
            while True:
                try:
                    batch = batches.get(timeout=LOG_QUIET_SECONDS)
                except queue.Empty:
                    if ended:
                        return
                    batch = []
                if batch is None:
                    return
                if batch:
                    yield batch
                if not ended and time.monotonic() >= next_check:
                    next_check = time.monotonic() + TASK_CHECK_SECONDS
                    ended = self._task_ended(replica_id)
        finally:
            _hang_up(self.api, response, reader)

    def _task_ended(self, service_id: str) -> bool:
        from docker.errors import NotFound

        try:
            service = self.api.inspect_service(service_id)
        except NotFound:
            return True
        return replica_status(service, self._latest_task(service_id)) == ReplicaStatus.EXITED


def job_network(plan: LaunchPlan) -> NetworkSpec | None:
    """The job's network: the plan's, and for a lone replica that reaches gs:// one of its own
    too, for its storage endpoint (no network on a swarm joins the replicas of two jobs). A lone
    replica without gs:// needs none: its own hostname is in its /etc/hosts."""
    if plan.network or not plan.storage:
        return plan.network
    lone = plan.containers[0]
    scope = {k: v for k, v in lone.labels.items() if k in (LABEL_JOB, LABEL_INSTALLATION, LABEL_TRIAL)}
    return NetworkSpec(short_name(f"{lone.name}-net", CONFIG_NAME_MAX), scope, 1)


def _pump(response: Any, batches: queue.Queue) -> None:
    """Copy a log stream's batches of frames into a queue (None at its end): the follow can
    then stop waiting for frames that will never come."""
    try:
        for batch in frame_blocks(body_blocks(response)):
            batches.put(batch)
    except Exception:  # noqa: BLE001 - the stream was hung up: the end
        pass
    batches.put(None)


def _hang_up(api: EngineApi, response: Any, reader: threading.Thread) -> None:
    """End a streaming response whose reader thread may be blocked reading it: shutting the
    socket down wakes the reader (closing it would wait for the reader's lock)."""
    sock = api._get_raw_response_socket(response)
    try:
        getattr(sock, "_sock", sock).shutdown(socket.SHUT_RDWR)  # a unix socket's SocketIO holds it
    except OSError:
        pass
    reader.join(5)
    if not reader.is_alive():
        response.close()

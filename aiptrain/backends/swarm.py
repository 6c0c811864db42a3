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
through the installation's storage endpoint run here as a service of one task, placed on this
manager node (where $AIPTRAIN_HOME/gcs is, bind-mounted into it) and attached to one attachable
overlay network per installation under Google's API host names as network aliases. Every
replica of a job that uses it joins that network too, so those names resolve to the endpoint
on any node; its CA bundle and gsutil/gcloud travel as configs like the packages. Started by
the first launch that needs it, removed with its network when the installation's last active
job ends (`release_shared`). Not one endpoint attached to each job's own network: adding a
network to a service replaces its task (every running job would lose gs:// for a moment), and
Docker 20.10 refuses to connect a task's container to another overlay ("network not found").
The cost: replicas of different jobs share that network, so one could reach another's ports by
address, which the docker backend's lone replicas cannot.

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

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import ClassVar

from aiptrain.backends import LogChunk, ReplicaObservation, ReplicaStatus
from aiptrain.backends.docker import (
    LABEL_HOME,
    NETWORK_PATIENCE_SECONDS,
    DockerBackend,
    NoEndpointImage,
    engine_error,
    engine_is_local,
    labelled_observation,
    subnet_pool,
)
from aiptrain.backends.engine_logs import body_blocks, frame_blocks, read_log_lines
from aiptrain.errors import AiptrainError, EnvironmentNotReady, ValidationError
from aiptrain.labels import LABEL_CODE, LABEL_INSTALLATION, LABEL_ROLE
from aiptrain.logs import parse_engine_time
from aiptrain.planning import (
    ContainerSpec,
    LaunchPlan,
    Mount,
    NetworkSpec,
)
from aiptrain.settings import DEFAULT_SUBNET_POOL, Settings
from aiptrain.storage.endpoint import API_HOSTS, REPLICA_PORT, ROLE, StorageEndpoint

log = logging.getLogger(__name__)

# Swarm's task states as replica states (swarmkit's TaskState), in one table; a service whose
# task the orchestrator has not made yet is CREATED too (see `replica_status`).
TASK_STATES = {
    "new": ReplicaStatus.CREATED,
    "allocated": ReplicaStatus.CREATED,
    "pending": ReplicaStatus.CREATED,  # waiting for a node with the resources it reserves
    "assigned": ReplicaStatus.CREATED,
    "accepted": ReplicaStatus.CREATED,
    "preparing": ReplicaStatus.CREATED,
    "ready": ReplicaStatus.CREATED,
    "starting": ReplicaStatus.CREATED,
    "running": ReplicaStatus.RUNNING,
    "complete": ReplicaStatus.EXITED,
    "failed": ReplicaStatus.EXITED,
    "shutdown": ReplicaStatus.EXITED,
    "rejected": ReplicaStatus.EXITED,  # never started: e.g. the image is not on the node
    "orphaned": ReplicaStatus.EXITED,  # its node went away
    "remove": ReplicaStatus.EXITED,
}
_RAN = ("complete", "failed", "shutdown")  # states whose task had a container with an exit status
CONFIG_MAX_BYTES = 1_024_000 - 1  # swarmkit: "config data must be ... less than 1024000 bytes"
SERVICE_NAME_MAX = 63  # a DNS label
CONFIG_NAME_MAX = 64
GPU_RESOURCE = "NVIDIA-GPU"  # the generic resource GPU nodes advertise (dockerd --node-generic-resource)
# A job's overlay subnet holds its replicas, one load-balancer address per node, and a few spare
# for tasks re-run while their predecessor still holds its address.
SPARE_ADDRESSES = 4
UPDATE_ATTEMPTS = 10  # a service updated by two processes at once: the later one tries again
RESTART_PATIENCE_SECONDS = 30  # for the orchestrator to make a re-run task
STOP_PATIENCE_SECONDS = 10  # beyond the grace period, for the node to report a stopped task
LOG_QUIET_SECONDS = 0.3  # a follow ends once the task has ended and its output is this quiet
TASK_CHECK_SECONDS = 0.5
STORAGE_ROLE = "storage-network"  # the installation's overlay network its storage endpoint serves on
STORAGE_PREFIX = "aiptrain-gcs"
STORAGE_NETWORK_ADDRESSES = 1000  # every replica of every running job that reaches gs://, and spare
ENDPOINT_READY_SECONDS = 60  # a swarm schedules, then starts, the endpoint's task
# The endpoint listens on 443 itself (replicas reach its address, no port is published) with every
# capability dropped: its network namespace lets unprivileged processes bind low ports.
ENDPOINT_SYSCTLS = {"net.ipv4.ip_unprivileged_port_start": str(REPLICA_PORT)}
NOT_A_MANAGER = (
    "This Docker engine is not a Swarm manager: run `docker swarm init` on it (and `docker swarm join` "
    "on the other machines), or submit with --backend docker."
)


@dataclass(frozen=True)
class Node:
    """What one node of the swarm offers replicas."""

    nano_cpus: int
    memory_bytes: int
    gpus: int = 0


def short_name(name: str, limit: int) -> str:
    """`name`, or when longer than `limit` its start and a digest of the whole: distinct names stay distinct."""
    if len(name) <= limit:
        return name
    return f"{name[:limit - 9].rstrip('-_')}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def replica_status(service: dict, task: dict | None) -> ReplicaStatus:
    """A replica's status from its latest task. With no task, a stopped replica (scaled to zero,
    whose task the swarm may then delete) has EXITED; any other is yet to start."""
    if task:
        return TASK_STATES.get(task["Status"]["State"], ReplicaStatus.EXITED)
    return ReplicaStatus.EXITED if stopped(service) else ReplicaStatus.CREATED


def stopped(service: dict) -> bool:
    return ((service["Spec"].get("Mode") or {}).get("Replicated") or {}).get("Replicas", 1) == 0


def latest_task(tasks: list[dict]) -> dict | None:
    """The task of the service's latest run: a restart (forced update) makes a new one."""
    return max(tasks, key=lambda t: parse_engine_time(t["CreatedAt"]), default=None)


def exit_status(task: dict) -> int | None:
    """A task's exit status: 0 for a complete one (the engine omits a zero ExitCode), its
    container's for a failed or shut-down one, None for one that never ran."""
    state = task["Status"]["State"]
    if state == "complete":
        return 0
    return (task["Status"].get("ContainerStatus") or {}).get("ExitCode") if state in _RAN else None


def observation(service: dict, task: dict | None) -> ReplicaObservation:
    """One replica as its service and latest task show it; the service's ID is the replica's handle."""
    labels = service["Spec"]["Labels"]
    status = replica_status(service, task)
    exit_code = finished = None
    error = ""
    if status == ReplicaStatus.EXITED and task:
        exit_code = exit_status(task)
        error = "" if exit_code is not None else task["Status"].get("Err") or task["Status"]["State"]
    if status == ReplicaStatus.EXITED and task and exit_code != 0:  # a failure: its time orders failures
        finished = datetime.fromtimestamp(parse_engine_time(task["Status"]["Timestamp"]) / 1e9).astimezone()
    return labelled_observation(labels, service["ID"], status, exit_code, finished, error)


def check_gpus(specs: tuple[ContainerSpec, ...], nodes: list[Node]) -> None:
    """Refuse a job whose replicas' GPUs no set of the nodes holds at once: Swarm would keep
    them pending forever. CPUs and memory are not reserved (see the module's docstring)."""
    free = sorted((n.gpus for n in nodes), reverse=True)
    for wanted in sorted((s.gpus for s in specs if s.gpus), reverse=True):
        index = next((i for i, gpus in enumerate(free) if gpus >= wanted), None)
        if index is None:
            asked = " + ".join(str(s.gpus) for s in specs if s.gpus)
            raise ValidationError(
                f"The job's replicas ask for {asked} GPU(s) but the swarm's {len(nodes)} ready node(s) offer "
                f"{', '.join(str(n.gpus) for n in nodes) or 'none'}: submit without accelerators, or add GPU nodes "
                f"(dockerd --node-generic-resource {GPU_RESOURCE}=...)."
            )
        free[index] -= wanted


def carried_files(mounts: tuple[Mount, ...]) -> list[tuple[Path, str]]:
    """(host file, path in the replica) of every read-only mount's files, which travel as
    configs; each is checked against a config's size limit here, before anything is created."""
    files = []
    for mount in mounts:
        if not mount.read_only:
            continue
        source = Path(mount.source)
        if source.is_dir():
            for directory, _, names in sorted(os.walk(source, followlinks=True)):
                for name in sorted(names):
                    path = Path(directory) / name
                    files.append((path, f"{mount.target}/{path.relative_to(source).as_posix()}"))
        else:
            files.append((source, mount.target))
    for path, _ in files:
        size = path.stat().st_size
        if size > CONFIG_MAX_BYTES:
            raise ValidationError(
                f"[{path.name}] is {size / 1e6:.1f} MB: a swarm carries a job's files to its nodes as Swarm configs "
                "of under 1 MB each. Build an image with it installed and present on every node "
                "(--master-image-uri), or submit with --backend docker."
            )
    return files


def plan_mounts(plan: LaunchPlan) -> tuple[Mount, ...]:
    """Every mount of the plan's replicas, once each."""
    return tuple(sorted({m for spec in plan.containers for m in spec.mounts}, key=lambda m: (m.target, m.source)))


def unshared_dirs(mounts: tuple[Mount, ...], shared_dirs: tuple[str, ...]) -> list[str]:
    """The writable bind mounts' host directories that no shared directory holds."""
    shared = [Path(d).resolve() for d in shared_dirs]
    return [m.source for m in mounts
            if not m.read_only and not any(Path(m.source).resolve().is_relative_to(d) for d in shared)]


def service_spec(spec: ContainerSpec, env: dict[str, str], network: str | None, configs: list[dict],
                 constraints: tuple[str, ...], stop_grace_seconds: int, storage_network: str | None = None) -> dict:
    """The arguments of `create_service` that run one replica (see the module's docstring): on
    its job's network under its hostname, and on the storage endpoint's network when it has one."""
    from docker.types import ContainerSpec as SwarmContainerSpec
    from docker.types import (
        EndpointSpec,
        NetworkAttachmentConfig,
        Placement,
        Resources,
        RestartPolicy,
        ServiceMode,
        TaskTemplate,
    )
    from docker.types import Mount as EngineMount

    mounts = [EngineMount(m.target, m.source, type="bind") for m in spec.mounts if not m.read_only]
    mounts.append(EngineMount("/dev/shm", None, type="tmpfs", tmpfs_size=spec.shm_bytes))
    container = SwarmContainerSpec(
        spec.image, command=spec.entrypoint, args=spec.command or None, hostname=spec.hostname, env=env,
        workdir=spec.working_dir, user=spec.user, labels=spec.labels, mounts=mounts, configs=configs or None,
        init=True, cap_drop=["ALL"], stop_grace_period=stop_grace_seconds * 1_000_000_000,
    )
    resources = Resources(cpu_limit=spec.nano_cpus, mem_limit=spec.memory_bytes,
                          generic_resources={GPU_RESOURCE: spec.gpus} if spec.gpus else None)
    if spec.pids_limit:
        resources.setdefault("Limits", {})["Pids"] = spec.pids_limit
    template = TaskTemplate(
        container, resources=resources, restart_policy=RestartPolicy("none"),
        placement=Placement(constraints=list(constraints)) if constraints else None,
        networks=[*([NetworkAttachmentConfig(network, aliases=[spec.hostname])] if network else []),
                  *([NetworkAttachmentConfig(storage_network)] if storage_network else [])] or None,
    )
    return {"task_template": template, "name": short_name(spec.name, SERVICE_NAME_MAX), "labels": spec.labels,
            "mode": ServiceMode("replicated", replicas=1), "endpoint_spec": EndpointSpec(mode="dnsrr")}


def endpoint_service_spec(endpoint: StorageEndpoint, image: str, network: str, node_id: str,
                          labels: dict[str, str]) -> dict:
    """The arguments of `create_service` that run the storage endpoint: one task on the node
    whose disk holds the gcs tree, unprivileged like a replica (the replicas' user, no
    capabilities, read-only root, only the tree writable), answering on the storage network for
    Google's API host names, restarted by the swarm if it dies."""
    from docker.types import ContainerSpec as SwarmContainerSpec
    from docker.types import (
        EndpointSpec,
        NetworkAttachmentConfig,
        Placement,
        Resources,
        RestartPolicy,
        ServiceMode,
        TaskTemplate,
    )
    from docker.types import Mount as EngineMount

    mounts = [EngineMount(target, source, type="bind", read_only=read_only)
              for source, target, read_only in endpoint.mounts()]
    mounts.append(EngineMount("/tmp", None, type="tmpfs"))
    container = SwarmContainerSpec(
        image, command=endpoint.command_on(REPLICA_PORT), user=endpoint.user, workdir="/tmp", mounts=mounts,
        env={"PYTHONDONTWRITEBYTECODE": "1"}, read_only=True, init=True, cap_drop=["ALL"],
        sysctls=ENDPOINT_SYSCTLS,
    )
    resources = Resources()
    resources["Limits"] = {"Pids": 512}
    template = TaskTemplate(
        container, resources=resources, restart_policy=RestartPolicy("any", delay=1_000_000_000),
        placement=Placement(constraints=[f"node.id=={node_id}"]),
        networks=[NetworkAttachmentConfig(network, aliases=list(API_HOSTS))],
    )
    return {"task_template": template, "name": endpoint.name, "labels": labels,
            "mode": ServiceMode("replicated", replicas=1), "endpoint_spec": EndpointSpec(mode="dnsrr")}


def config_reference(config_id: str, name: str, target: str, user: str, executable: bool = False) -> dict:
    """A replica's view of one carried file: its user's, read-only, executable when the host's file is (tools)."""
    from docker.types import ConfigReference

    uid, _, gid = user.partition(":")
    return ConfigReference(config_id, name, filename=target, uid=uid if uid.isdigit() else "0",
                           gid=gid if gid.isdigit() else "0", mode=0o555 if executable else 0o444)


class SwarmBackend(DockerBackend):
    """A Docker Swarm through one of its managers (DOCKER_HOST, or this host's engine). What
    it shares with the docker backend: the connection, label filters, subnet picking, removing
    the containers this node still keeps, engine events and the log line assembly."""

    name = "swarm"
    host_dirs_reach_replicas = False
    network_options: ClassVar[dict] = {"driver": "overlay", "attachable": True}
    logs_path = "/services/{0}/logs"

    def __init__(self, installation: str | None = None, client=None, subnet_pool: str = DEFAULT_SUBNET_POOL,
                 shared_dirs: tuple[str, ...] = (), constraints: tuple[str, ...] = (), stop_grace_seconds: int = 10,
                 home: str | None = None):
        super().__init__(installation, client, subnet_pool, home)
        self._shared_dirs = shared_dirs
        self._constraints = constraints
        self._stop_grace_seconds = stop_grace_seconds

    @classmethod
    def from_settings(cls, settings: Settings) -> SwarmBackend:
        return cls(settings.installation_id, subnet_pool=settings.subnet_pool, shared_dirs=settings.swarm_shared_dirs,
                   constraints=settings.swarm_constraints, stop_grace_seconds=settings.stop_grace_seconds,
                   home=str(settings.home))

    # -- readiness -----------------------------------------------------------------------

    def check_ready(self, plan: LaunchPlan) -> None:
        swarm = self.api.info().get("Swarm") or {}
        if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
            raise EnvironmentNotReady(NOT_A_MANAGER)
        subnet_pool(self._subnet_pool)
        self._check_images(plan, " (every node of the swarm needs it)")
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
        with self._removed_on_failure(plan):
            nodes = self._nodes()
            check_gpus(plan.containers, nodes)
            network = plan.network
            if network:  # a lone replica needs none: its own hostname is in its /etc/hosts
                self._create_network(dataclasses.replace(network, addresses=network.addresses + len(nodes) + SPARE_ADDRESSES))
            # Serving before any replica starts, as on the docker backend.
            storage = self._storage_network_or_none(plan.storage) if plan.storage else None
            configs = self._create_configs(plan)
            self._each(lambda spec: self._create_service(plan, spec, configs, storage), plan.containers)

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

        self._each(create, list(enumerate(files)))
        return created

    def _create_service(self, plan: LaunchPlan, spec: ContainerSpec, configs: dict[str, tuple[str, str]],
                        storage_network: str | None = None) -> None:
        carried = {target: path for path, target in carried_files(spec.mounts)}
        references = [config_reference(*configs[target], target, spec.user, os.access(carried[target], os.X_OK))
                      for target in sorted(carried)]
        network = plan.network.name if plan.network else None
        self.api.create_service(**service_spec(spec, plan.environment(spec), network, references,
                                               self._constraints, self._stop_grace_seconds, storage_network))

    # -- the storage endpoint: a service on the installation's storage network -----------------

    @property
    def storage_network_name(self) -> str:
        return f"{STORAGE_PREFIX}-{self._installation[:8]}" if self._installation else STORAGE_PREFIX

    def _storage_network_or_none(self, endpoint: StorageEndpoint) -> str | None:
        """The storage network's ID, its endpoint started if need be. With no image to run the
        endpoint, the job runs without (its gs:// fails as offline), said in the log."""
        try:
            return self.ensure_storage_endpoint(endpoint)
        except NoEndpointImage as exc:
            log.warning("%s", exc)
            return None

    def ensure_storage_endpoint(self, endpoint: StorageEndpoint) -> str:
        """The ID of the network on which the installation's storage endpoint serves, once it
        serves: network and service made if absent, the service replaced when it runs other
        code or on another network. One launch at a time makes them (the home's lock)."""
        from docker.errors import APIError, NotFound

        endpoint.prepare_files()
        with self._home_lock("storage-endpoint"):
            for _ in range(3):
                network = self._storage_network()
                for service in self._endpoint_services():
                    if endpoint_current(service, endpoint.labels[LABEL_CODE], network):
                        self._wait_serving(service["ID"])
                        return network
                    with contextlib.suppress(NotFound):
                        self.api.remove_service(service["ID"])
                image = self._present_image(endpoint.images)
                node_id = self.api.info()["Swarm"]["NodeID"]
                labels = self._with_home({**endpoint.labels, **self._installation_labels(ROLE)})
                try:
                    service = self.api.create_service(**endpoint_service_spec(endpoint, image, network, node_id,
                                                                              labels))
                except APIError as exc:
                    if "not found" not in engine_error(exc):
                        raise
                    self._wait_gone(network)  # removed by a release that did not wait for it: make it again
                    continue
                self._wait_serving(service["ID"])
                return network
        raise EnvironmentNotReady(f"The storage network {self.storage_network_name} keeps changing: try again.")

    def _storage_network(self) -> str:
        """The storage network's ID, created on first need (a subnet from the pool, as a job's)."""
        found = self._storage_networks()
        if not found:
            self._create_network(NetworkSpec(self.storage_network_name, self._installation_labels(STORAGE_ROLE),
                                             STORAGE_NETWORK_ADDRESSES))
            found = self._storage_networks()
        if not found:
            raise EnvironmentNotReady(f"Docker did not keep the network {self.storage_network_name}: try again.")
        return found[0]["Id"]

    def _storage_networks(self) -> list[dict]:
        found = self.api.networks(names=[self.storage_network_name], filters={"label": f"{LABEL_ROLE}={STORAGE_ROLE}"})
        return sorted((n for n in found if n["Name"] == self.storage_network_name), key=lambda n: n["Created"])

    def _endpoint_services(self) -> list[dict]:
        owner = [f"{LABEL_INSTALLATION}={self._installation}"] if self._installation else []
        return self.api.services(filters={"label": [*owner, f"{LABEL_ROLE}={ROLE}"]})

    def _wait_serving(self, service_id: str) -> None:
        """Until the endpoint's task runs and says it serves. A task that fails meanwhile is
        reported with its error and output: the swarm makes its replacement at once (to start
        after the restart delay), so the failure is seen in the service's tasks, not its latest."""
        earlier = {t["ID"] for t in self.api.tasks(filters={"service": service_id})}
        deadline = time.monotonic() + ENDPOINT_READY_SECONDS
        status: dict = {}
        while time.monotonic() < deadline:
            tasks = self.api.tasks(filters={"service": service_id})
            task = latest_task(tasks)
            status = task["Status"] if task else {"State": "new"}
            if status["State"] == "running" and "serving" in self._service_output(service_id):
                return
            failed = [t["Status"] for t in tasks if t["ID"] not in earlier and t["Status"]["State"] in ("failed", "rejected")]
            if failed:
                output = self._service_output(service_id).strip()[-300:]
                raise AiptrainError(f"The storage endpoint for gs:// did not start: {output or failed[0].get('Err')}")
            time.sleep(0.1)
        why = f" ({status['Err']})" if status.get("Err") else ""  # e.g. this node is drained: no suitable node
        raise AiptrainError(f"The storage endpoint for gs:// did not start on this node within "
                            f"{ENDPOINT_READY_SECONDS}s{why}: see `docker service ps {service_id[:12]}`.")

    def _service_output(self, service_id: str) -> str:
        output = self.api.service_logs(service_id, stdout=True, stderr=True)
        return (output if isinstance(output, bytes) else b"".join(output)).decode(errors="replace")

    def release_shared(self, still_needed: Callable[[], bool]) -> None:
        """The storage endpoint and its network never outlive the installation's jobs: removed
        when the last active one ends (the next launch makes them again, a second or two).
        Under the lock a launch makes them with, so a job recorded before its launch keeps them."""
        if not self._installation or not self._home:
            return
        with self._home_lock("storage-endpoint"):
            if still_needed():
                return
            self._remove_storage()

    def _remove_storage(self) -> None:
        from docker.errors import NotFound

        for service in self._endpoint_services():
            with contextlib.suppress(NotFound):
                self.api.remove_service(service["ID"])
            self._wait_containers_gone(service["ID"])  # a task still starting would bring the network back here
        for network in self._storage_networks():
            self._remove_network(network["Id"])
            self._wait_gone(network["Id"])

    def _wait_containers_gone(self, service_id: str) -> None:
        """Until this node has removed the containers of a removed service's tasks."""
        deadline = time.monotonic() + NETWORK_PATIENCE_SECONDS
        while time.monotonic() < deadline:
            if not self.api.containers(all=True, filters={"label": f"com.docker.swarm.service.id={service_id}"}):
                return
            time.sleep(0.2)

    def _wait_gone(self, network_id: str) -> None:
        """Until a removed overlay network is gone: the swarm keeps one whose tasks are still
        shutting down for a few seconds, and this engine lists it a moment longer; a service
        created on it meanwhile fails ("network ... not found"), so the next launch would."""
        from docker.errors import NotFound

        deadline = time.monotonic() + NETWORK_PATIENCE_SECONDS
        while time.monotonic() < deadline:
            try:
                self.api.inspect_network(network_id, scope="swarm")
            except NotFound:
                if not any(n["Id"] == network_id for n in self._storage_networks()):
                    return
            time.sleep(0.2)
        raise AiptrainError(f"The swarm keeps the removed network {network_id[:12]}: see `docker network ls`.")

    def remove_abandoned(self, active_jobs: Callable[[], Collection[str]] | None = None) -> None:
        """First the storage endpoints of homes deleted from this host, and their storage
        networks (the swarm would restart an endpoint's task for good, and it holds its network),
        then what the docker backend sweeps."""
        from docker.errors import APIError, NotFound

        try:  # not a manager (left the swarm meanwhile, say): no services to look at
            endpoints = self.api.services(filters={"label": [LABEL_HOME, f"{LABEL_ROLE}={ROLE}"]}) \
                if engine_is_local() else []
        except APIError:
            endpoints = []
        for service in endpoints:
            labels = service["Spec"].get("Labels") or {}
            if not self._deleted(labels.get(LABEL_HOME, "")):
                continue
            with contextlib.suppress(NotFound, APIError):  # gone meanwhile
                self.api.remove_service(service["ID"])
            self._wait_containers_gone(service["ID"])
            for network in self.api.networks(filters={"label": [f"{LABEL_HOME}={labels[LABEL_HOME]}",
                                                                f"{LABEL_ROLE}={STORAGE_ROLE}"]}):
                with contextlib.suppress(NotFound, APIError, AiptrainError):  # still held: the next sweep's
                    self._remove_network(network["Id"])
        super().remove_abandoned(active_jobs)

    def remove_installation(self) -> None:
        """What the installation shares on the swarm (storage endpoint and network), then on this engine."""
        if self._installation:
            self._remove_storage()
        super().remove_installation()

    # -- observation ---------------------------------------------------------------------

    def _services(self, job_id: str, trial_id: str | None = None) -> list[dict]:
        return self.api.services(filters={"label": self._job_labels(job_id, trial_id)})

    def observe(self, job_id: str) -> list[ReplicaObservation]:
        services = self._services(job_id)
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

        self._each(stop_one, container_ids)

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

        self._each(remove_service, self._services(job_id, trial_id))
        super().remove(job_id, trial_id)
        self._each(remove_config, self.api.configs(filters={"label": self._job_labels(job_id, trial_id)}))

    # -- logs ----------------------------------------------------------------------------

    def follow_logs(self, container_id: str, since_ns: int | None = None) -> Iterator[list[LogChunk]]:
        """The replica's output from `since_ns` on, until its task has ended: a service's log
        follow never ends by itself (a job's service outlives its task), so it is ended here once
        the task has ended and its output is quiet, and then read once more plainly."""
        yield from read_log_lines(functools.partial(self._log_frames, container_id), since_ns, read_again=True)

    def _log_frames(self, replica_id: str, since_ns: int | None,
                    follow: bool) -> Iterator[list[tuple[int, bytes]]]:
        if not follow:
            yield from super()._log_frames(replica_id, since_ns, follow)
            return
        response = self._open_logs(replica_id, since_ns, follow=True)
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


def endpoint_current(service: dict, code: str, network: str) -> bool:
    """Whether the endpoint's service runs this aiptrain's server code on the storage network."""
    template = service["Spec"]["TaskTemplate"]
    networks = template.get("Networks") or service["Spec"].get("Networks") or []
    return (service["Spec"].get("Labels", {}).get(LABEL_CODE) == code
            and any(n.get("Target") == network for n in networks))


def node_capacity(node: dict) -> Node:
    resources = node["Description"].get("Resources") or {}
    gpus = sum(_gpu_count(g) for g in resources.get("GenericResources") or [])
    return Node(resources.get("NanoCPUs", 0), resources.get("MemoryBytes", 0), gpus)


def _node_attribute(node: dict, name: str) -> str | None:
    """A node's value of a placement constraint's left side (Docker's `node.*` and `engine.labels.*`)."""
    description = node.get("Description") or {}
    fixed = {
        "node.id": node.get("ID"),
        "node.hostname": description.get("Hostname"),
        "node.role": (node.get("Spec") or {}).get("Role"),
        "node.platform.os": (description.get("Platform") or {}).get("OS"),
        "node.platform.arch": (description.get("Platform") or {}).get("Architecture"),
    }
    if name in fixed:
        return fixed[name]
    if name.startswith("node.labels."):
        return ((node.get("Spec") or {}).get("Labels") or {}).get(name[len("node.labels."):])
    if name.startswith("engine.labels."):
        return ((description.get("Engine") or {}).get("Labels") or {}).get(name[len("engine.labels."):])
    return None


def meets(node: dict, constraint: str) -> bool:
    """Whether the node meets a placement constraint (`node.role==manager`, `node.labels.gpu!=no`)."""
    equal = "!=" not in constraint
    name, _, value = constraint.partition("==" if equal else "!=")
    actual = _node_attribute(node, name.strip())
    return (actual is not None and actual.lower() == value.strip().lower()) == equal


def _gpu_count(resource: dict) -> int:
    """A node's generic resource, as GPUs: `NVIDIA-GPU=2` (discrete) or one per named GPU."""
    discrete = resource.get("DiscreteResourceSpec") or {}
    if discrete.get("Kind") == GPU_RESOURCE:
        return int(discrete.get("Value", 0))
    return 1 if (resource.get("NamedResourceSpec") or {}).get("Kind") == GPU_RESOURCE else 0


def _pump(response, batches: queue.Queue) -> None:
    """Copy a log stream's batches of frames into a queue (None at its end): the follow can
    then stop waiting for frames that will never come."""
    try:
        for batch in frame_blocks(body_blocks(response)):
            batches.put(batch)
    except Exception:  # noqa: BLE001 - the stream was hung up: the end
        pass
    batches.put(None)


def _hang_up(api, response, reader: threading.Thread) -> None:
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

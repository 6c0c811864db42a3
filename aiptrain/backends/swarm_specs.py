"""The swarm backend's pure rules (no engine asked): task states as replica statuses, a replica
as a one-task service, placement constraints and GPUs, the files carried to other nodes as
configs, the storage endpoint's service. aiptrain.backends.swarm says why each is so."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from aiptrain.backends import ReplicaObservation, ReplicaStatus
from aiptrain.backends.engine import labelled_observation
from aiptrain.errors import ValidationError
from aiptrain.logs import parse_engine_time
from aiptrain.planning import ContainerSpec, LaunchPlan, Mount
from aiptrain.storage.endpoint import API_HOSTS, REPLICA_PORT, StorageEndpoint

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
                 constraints: tuple[str, ...], stop_grace_seconds: int) -> dict:
    """The arguments of `create_service` that run one replica (see the module's docstring): on
    its job's network under its hostname (where its storage endpoint is too), the only one."""
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
        networks=[NetworkAttachmentConfig(network, aliases=[spec.hostname])] if network else None,
    )
    return {"task_template": template, "name": short_name(spec.name, SERVICE_NAME_MAX), "labels": spec.labels,
            "mode": ServiceMode("replicated", replicas=1), "endpoint_spec": EndpointSpec(mode="dnsrr")}


def endpoint_service_spec(endpoint: StorageEndpoint, image: str, network: str, node_id: str,
                          labels: dict[str, str], name: str | None = None) -> dict:
    """The arguments of `create_service` that run a storage endpoint: one task on the node
    whose disk holds the gcs tree, unprivileged like a replica (the replicas' user, no
    capabilities, read-only root, only the tree writable), answering on `network` (a job's)
    for Google's API host names, restarted by the swarm if it dies. Its container carries
    `labels` too, so a job's teardown finds what this node keeps of it."""
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
        sysctls=ENDPOINT_SYSCTLS, labels=labels,
    )
    resources = Resources()
    resources["Limits"] = {"Pids": 512}
    template = TaskTemplate(
        container, resources=resources, restart_policy=RestartPolicy("any", delay=1_000_000_000),
        placement=Placement(constraints=[f"node.id=={node_id}"]),
        networks=[NetworkAttachmentConfig(network, aliases=list(API_HOSTS))],
    )
    return {"task_template": template, "name": short_name(name or endpoint.name, SERVICE_NAME_MAX), "labels": labels,
            "mode": ServiceMode("replicated", replicas=1), "endpoint_spec": EndpointSpec(mode="dnsrr")}


def config_reference(config_id: str, name: str, target: str, user: str, executable: bool = False) -> dict:
    """A replica's view of one carried file: its user's, read-only, executable when the host's file is (tools)."""
    from docker.types import ConfigReference

    uid, _, gid = user.partition(":")
    return ConfigReference(config_id, name, filename=target, uid=uid if uid.isdigit() else "0",
                           gid=gid if gid.isdigit() else "0", mode=0o555 if executable else 0o444)



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

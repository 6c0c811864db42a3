"""The engine handle every part of the Docker and Swarm backends holds: the connection, the
labels and locks of the home it works for, containers made and removed, images looked up.

The job semantics (aiptrain.backends.docker, .swarm), the job networks (.networks), the storage
endpoint (.endpoint) and the sweep (.sweep) each hold one `Engine` rather than inheriting one
class that holds them all. Outside the backends, the module's functions are the one way to the
engine that is not a backend's (`connect`, `inspect_image`): the runtime images and their build.

Every replica runs unprivileged: the host user's uid (or nobody when aiptrain runs as root), all
capabilities dropped, no-new-privileges, a read-only root filesystem with a tmpfs /tmp, the
packages read-only, and only the job dir writable. The Docker socket is never mounted. An init
process (tini) is PID 1, so SIGTERM reaches the trainer and a stop takes milliseconds instead of
the whole grace period.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

from aiptrain.backends import ImageInfo, ReplicaObservation, ReplicaStatus
from aiptrain.errors import AiptrainError, EnvironmentNotReady, first_line
from aiptrain.labels import (
    LABEL_HOME,
    LABEL_INSTALL_FOR,
    LABEL_INSTALLATION,
    LABEL_JOB,
    LABEL_ROLE,
    LABEL_TASK,
    LABEL_TASK_INDEX,
    LABEL_TASK_TYPE,
    LABEL_TRIAL,
)
from aiptrain.planning import ContainerSpec, LaunchPlan

log = logging.getLogger(__name__)
# docker-py's low-level client (docker.APIClient): the SDK has no type information.
EngineApi = Any
T = TypeVar("T")

TMPFS_OPTIONS = "rw,nosuid,nodev,exec,size=4g"
DEFAULT_NETWORK = "bridge"  # the engine's own network, never created or removed here


class NoEndpointImage(EnvironmentNotReady):
    """No image on the engine can run the storage endpoint."""


# One low-level client per process and timeout (its connection pool is thread-safe): a submit
# asked for one in three places, and each new client costs a connection and a version request.
_CLIENTS: dict[tuple[int, tuple[str | None, ...]], EngineApi] = {}
# Where the engine is, as the docker CLI reads it (docker.utils.kwargs_from_env).
ENGINE_VARIABLES = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")
_CLIENTS_LOCK = threading.Lock()
os.register_at_fork(after_in_child=_CLIENTS.clear)  # a forked child never shares its parent's sockets


def inspect_image(api: EngineApi, image: str) -> ImageInfo | None:
    """The engine's record of an image; None when it has none."""
    from docker.errors import ImageNotFound

    try:
        record = api.inspect_image(image)
    except ImageNotFound:
        return None
    return ImageInfo(record["Id"], record.get("Config", {}).get("Labels") or {})


def engine_is_local() -> bool:
    """Whether the engine is this host's own (its Unix socket), not one DOCKER_HOST names elsewhere."""
    host = os.environ.get("DOCKER_HOST", "")
    return not host or host.startswith("unix://")


def connect(timeout: int = 120) -> EngineApi:
    """The low-level client for the engine DOCKER_HOST names (or the local socket), connected
    once per process."""
    import docker
    from docker.errors import DockerException

    key = (timeout, tuple(os.environ.get(name) for name in ENGINE_VARIABLES))
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            try:
                # version="auto" asks the engine for its API version: that request is the reachability check.
                _CLIENTS[key] = docker.APIClient(version="auto", timeout=timeout, max_pool_size=64,
                                                 **docker.utils.kwargs_from_env())
            except DockerException as exc:
                raise EnvironmentNotReady(
                    f"Cannot reach the Docker engine ({_first_line(exc)}): start Docker or set DOCKER_HOST."
                ) from None
        return _CLIENTS[key]


def _first_line(exc: Exception) -> str:
    return first_line(exc, type(exc).__name__)


def engine_error(exc: Exception) -> str:
    """What the engine said, without the request URL docker-py puts first: one line."""
    from docker.errors import APIError

    if isinstance(exc, APIError) and exc.explanation:
        text = exc.explanation.decode(errors="replace") if isinstance(exc.explanation, bytes) else str(exc.explanation)
        return text.strip().splitlines()[0] if text.strip() else _first_line(exc)
    return _first_line(exc)


def host_gateway(api: EngineApi) -> str | None:
    """This host's address on Docker's default bridge (docker0), which every bridge network's
    containers can reach; None if the engine does not say."""
    try:
        configs = api.inspect_network("bridge").get("IPAM", {}).get("Config") or []
    except Exception:  # noqa: BLE001 - no default bridge: leave addresses alone
        return None
    for config in configs:
        if config.get("Gateway"):
            return config["Gateway"].split("/")[0]
        subnet = config.get("Subnet", "")
        if subnet and ":" not in subnet:
            return str(ipaddress.ip_network(subnet, strict=False)[1])  # Docker's default gateway
    return None


def host_listens(address: str, port: int) -> bool:
    """Whether a socket of this host listens on `port` at `address` or at every address, from the
    kernel's tables (/proc/net/tcp, tcp6)."""
    native = format(int.from_bytes(socket.inet_aton(address), sys.byteorder), "08X")
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                if listening_in(lines, {native, "0" * 8, "0" * 32}, port):
                    return True
        except OSError:
            continue
    return False


def listening_in(table: Iterable[str], addresses: set[str], port: int) -> bool:
    """Whether a /proc/net/tcp table lists a listening socket (state 0A) on `port` at one of
    `addresses`, written as the table writes them (hex, in the host's byte order)."""
    suffix = f":{port:04X}"
    for line in table:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A" and fields[1].endswith(suffix) and fields[1][:-5] in addresses:
            return True
    return False


def labelled_observation(labels: dict[str, str], replica_id: str, status: ReplicaStatus, exit_code: int | None = None,
                         finished: datetime | None = None, error: str = "") -> ReplicaObservation:
    """A replica's observation, who it is read from the labels its plan gave it."""
    return ReplicaObservation(
        task_name=labels[LABEL_TASK],
        task_type=labels[LABEL_TASK_TYPE],
        task_index=int(labels[LABEL_TASK_INDEX]),
        status=status,
        exit_code=exit_code,
        finished_at=finished,
        container_id=replica_id,
        trial_id=labels.get(LABEL_TRIAL, ""),
        error=error,
    )


def each(action: Callable[[T], object], items: Sequence[T]) -> None:
    """`action` on every item, 32 at a time; the first failure is raised."""
    if not items:
        return
    with ThreadPoolExecutor(max_workers=min(32, len(items))) as pool:
        list(pool.map(action, items))


class Engine:
    """One engine as one aiptrain home uses it: connected on first use (from any thread), and
    labelling what it makes with the home's installation and path."""

    def __init__(self, installation: str | None = None, client: EngineApi = None, home: str | None = None):
        self.installation = installation
        self.home = home  # labels all this makes, so what a deleted home left can be found
        self._client = client
        self._connecting = threading.Lock()

    @property
    def api(self) -> EngineApi:
        with self._connecting:  # submit warms up from a second thread: connect once
            if self._client is None:
                self._client = connect()
        return self._client

    def warm_up(self) -> None:
        """Connect ahead of need; a failure shows up on first real use."""
        try:
            self.api  # noqa: B018 - the property connects
        except Exception:  # noqa: BLE001 - reported by the call that needs the engine
            pass

    def host_address(self) -> str | None:
        """This host's address as replicas reach it (e.g. for an emulator running here)."""
        return host_gateway(self.api)

    # -- labels and locks of the home -----------------------------------------------------------

    def owner(self) -> list[str]:
        """The label filter that selects this installation's things (none without one)."""
        return [f"{LABEL_INSTALLATION}={self.installation}"] if self.installation else []

    def installation_labels(self, role: str) -> dict[str, str]:
        owner = {LABEL_INSTALLATION: self.installation} if self.installation else {}
        return {**owner, LABEL_ROLE: role}

    def with_home(self, labels: dict[str, str]) -> dict[str, str]:
        """`labels` and the home this engine works for, which the sweep goes by."""
        return {**labels, LABEL_HOME: self.home} if self.home else labels

    def job_labels(self, job_id: str, trial_id: str | None = None) -> list[str]:
        """Label filters that select this job (or one of its trials) of this aiptrain home,
        nothing of another home."""
        trial = [f"{LABEL_TRIAL}={trial_id}"] if trial_id else []
        return [f"{LABEL_JOB}={job_id}", *self.owner(), *trial]

    def deleted(self, home: str) -> bool:
        """Whether `home` (a LABEL_HOME value) names another home, no longer on this host."""
        return bool(home) and home != self.home and not os.path.isdir(home)

    @contextlib.contextmanager
    def home_lock(self, what: str) -> Iterator[None]:
        """One process of this home at a time makes `what` (a lock file in the home)."""
        if not self.home or not os.path.isdir(self.home):
            yield
            return

        with open(os.path.join(self.home, f".{what}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    # -- images ------------------------------------------------------------------------------------

    def inspect_image(self, image: str) -> ImageInfo | None:
        return inspect_image(self.api, image)

    def has_gpu_runtime(self) -> bool:
        return "nvidia" in self.api.info().get("Runtimes", {})

    def check_images(self, plan: LaunchPlan, where: str = "", present: Collection[str] = ()) -> None:
        """Every image of the plan is on the engine; those in `present` are known to be."""
        for image in sorted({c.image for c in plan.containers} - set(present)):
            if inspect_image(self.api, image) is None:
                raise EnvironmentNotReady(
                    f"Image [{image}] is not on this Docker engine{where}: build or load it first "
                    "(runtime images: `aiptrain runtimes build VERSION`)."
                )

    def present_image(self, images: tuple[str, ...]) -> str:
        """The first of the storage endpoint's images that is here (aiptrain's own containers run it)."""
        from docker.errors import ImageNotFound

        for image in images:
            try:
                self.api.inspect_image(image)
                return image
            except ImageNotFound:
                continue
        raise NoEndpointImage(
            f"None of the images that run the storage endpoint for gs:// is here ({', '.join(images)}): build the "
            "base image (`aiptrain runtimes build minimal`) or set AIPTRAIN_GCS=remote."
        )

    # -- containers --------------------------------------------------------------------------------

    def host_config(self, spec: ContainerSpec, network_mode: str, hosts: dict[str, str] | None = None) -> dict:
        """Every container aiptrain starts runs unprivileged: see the module's docstring."""
        from docker.types import DeviceRequest, Mount

        return self.api.create_host_config(
            mounts=[Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in spec.mounts],
            network_mode=network_mode,
            init=True,
            read_only=True,
            tmpfs={"/tmp": TMPFS_OPTIONS},
            shm_size=spec.shm_bytes,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            nano_cpus=spec.nano_cpus,
            mem_limit=spec.memory_bytes,
            pids_limit=spec.pids_limit,
            extra_hosts=hosts,
            device_requests=[DeviceRequest(count=spec.gpus, capabilities=[["gpu"]])] if spec.gpus else None,
        )

    def create(self, spec: ContainerSpec, env: dict[str, str], network: str,
               hosts: dict[str, str] | None = None, aliases: bool = True) -> str:
        """The replica's container on `network`, or in a holder's (`container:<ID>`), whose
        hostname and /etc/hosts it shares: the engine refuses to set them again there."""
        api = self.api
        joins = network.startswith("container:")
        host_config = self.host_config(spec, network, None if joins else hosts)
        # A lone replica's hostname is in its own /etc/hosts: no alias tells its neighbours its name.
        endpoint = api.create_endpoint_config(aliases=[spec.hostname]) if aliases and not joins else None
        container = api.create_container(
            spec.image,
            command=spec.command,
            entrypoint=spec.entrypoint,
            environment=env,
            hostname=None if joins else spec.hostname,
            labels=self.with_home(spec.labels),
            name=spec.name,
            user=spec.user,
            working_dir=spec.working_dir,
            host_config=host_config,
            networking_config=api.create_networking_config({network: endpoint}) if endpoint else None,
        )
        return container["Id"]

    def run_to_completion(self, spec: ContainerSpec) -> tuple[int, str]:
        """Run a one-off container with no network (an install step) and remove it; (status, output)."""
        api = self.api
        container = api.create_container(
            spec.image, command=spec.command, entrypoint=spec.entrypoint, environment=spec.env, user=spec.user,
            working_dir=spec.working_dir, labels=self.with_home(spec.labels), host_config=self.host_config(spec, "none"),
        )
        try:
            api.start(container["Id"])
            status = api.wait(container["Id"])["StatusCode"]
            output = api.logs(container["Id"]).decode(errors="replace")
        finally:
            api.remove_container(container["Id"], force=True)
        return status, output

    def remove_containers(self, container_ids: Iterable[str]) -> None:
        """Remove these containers (IDs or names) by force; those gone meanwhile are fine."""
        from docker.errors import APIError, NotFound

        for container_id in container_ids:
            with contextlib.suppress(NotFound, APIError):  # gone meanwhile
                self.api.remove_container(container_id, force=True)

    def job_containers(self, job_id: str, trial_id: str | None = None) -> list[dict]:
        return self.api.containers(all=True, filters={"label": self.job_labels(job_id, trial_id)})

    def leftover_containers(self, job_id: str, trial_id: str | None = None) -> list[dict]:
        """What of the job (or one trial) this engine keeps: its replicas' containers and, for the
        whole job, its install container if a killed submit left it."""
        containers = self.job_containers(job_id, trial_id)
        if trial_id is None:
            containers += self.api.containers(all=True, filters={"label": [f"{LABEL_INSTALL_FOR}={job_id}",
                                                                          *self.owner()]})
        return containers

    def remove_replicas(self, containers: list[dict], keep_networks: Collection[str]) -> None:
        """Remove the containers by force, each after it leaves its networks but `keep_networks`."""
        from docker.errors import APIError, NotFound

        def remove_one(container: dict) -> None:
            # Leaving the network first, while the container exists: removing replicas that
            # are still exiting can leave a stale endpoint that blocks the network's removal.
            for network in ((container.get("NetworkSettings") or {}).get("Networks") or {}):
                if network in keep_networks:
                    continue  # never removed by a job, so never blocked by a stale endpoint
                try:
                    self.api.disconnect_container_from_network(container["Id"], network, force=True)
                except (APIError, NotFound):
                    pass  # not connected any more
            try:
                self.api.remove_container(container["Id"], force=True)
            except NotFound:
                pass
            except APIError as exc:  # "removal already in progress" from a concurrent cleanup
                if "already in progress" not in str(exc):
                    raise

        each(remove_one, containers)

    # -- events --------------------------------------------------------------------------------

    def watch(self, stop: threading.Event, on_change: Callable[[str], None]) -> None:
        """Call `on_change(job_id)` whenever a replica of this installation starts or dies, until
        `stop` is set: the controller steps that job at once instead of at its next poll."""
        from docker.errors import DockerException
        from requests.exceptions import RequestException

        owner = f"{LABEL_INSTALLATION}={self.installation}" if self.installation else LABEL_JOB
        filters = {"label": [owner], "type": "container", "event": ["die", "start"]}
        while not stop.is_set():
            try:
                since = time.time()
                for event in self.api.events(since=since, until=since + 30, filters=filters, decode=True):
                    job_id = (event.get("Actor") or {}).get("Attributes", {}).get(LABEL_JOB)
                    if job_id:
                        on_change(job_id)
            except (DockerException, RequestException, OSError):
                stop.wait(1)  # the engine is away; the controller's poll carries on meanwhile


@contextlib.contextmanager
def removed_on_failure(plan: LaunchPlan, remove: Callable[[str, str | None], None]) -> Iterator[None]:
    """A launch that fails removes what it created (`remove(job, trial)`: of its trial only, so a
    failed trial's launch leaves the other trials be) and says why in one line: the launch's own
    error, even when the engine keeps something of it (a stale endpoint holding the job's network)."""
    try:
        yield
    except BaseException as exc:
        try:
            remove(plan.job_id, plan.trial_id)
        except Exception as leftover:  # noqa: BLE001 - the launch's error is the one to tell
            log.warning("The failed launch of job %s left something behind: %s", plan.job_id, leftover)
        if isinstance(exc, AiptrainError | KeyboardInterrupt):
            raise
        raise launch_error(exc) from exc


def launch_error(exc: BaseException) -> AiptrainError:
    """The engine's refusal as one line, with the exit status it deserves."""
    from docker.errors import APIError

    if isinstance(exc, APIError) and exc.status_code == 409:
        return EnvironmentNotReady(
            f"Docker refused the job's replicas ({engine_error(exc)}): remove the leftover container or "
            "network it names, then submit again."
        )
    if isinstance(exc, Exception):
        return AiptrainError(f"Docker could not start the job's replicas: {engine_error(exc)}")
    return AiptrainError(f"Docker could not start the job's replicas: {type(exc).__name__}")

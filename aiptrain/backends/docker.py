"""The Docker backend: one engine, one user-defined bridge network per job of two or more
replicas; lone replicas share one network per installation on which containers cannot reach
each other (inter-container traffic off: planning.own_network), created on first need, never
removed by a job, and released with the storage endpoint when the home's controller goes.

gs:// kept on this machine reaches replicas through the installation's storage endpoint
(aiptrain.storage.endpoint): a container on the engine's default bridge, started on demand,
whose port is published on the lone replicas' network gateway address only; every replica
resolves Google's API host names to that address (extra hosts), which any bridge network's
replicas reach through the host, and nothing else can.

Every replica runs unprivileged: the host user's uid (or nobody when aiptrain runs as
root), all capabilities dropped, no-new-privileges, a read-only root filesystem with
a tmpfs /tmp, the packages read-only, and only the job dir writable. The Docker
socket is never mounted. An init process (tini) is PID 1, so SIGTERM reaches the
trainer and a stop takes milliseconds instead of the whole grace period.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import ipaddress
import logging
import os
import re
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from aiptrain.backends import LogChunk, ReplicaObservation, ReplicaStatus
from aiptrain.backends.engine_logs import body_blocks, frame_blocks, read_log_lines
from aiptrain.errors import AiptrainError, EnvironmentLacks, EnvironmentNotReady, ValidationError, first_line
from aiptrain.labels import (
    LABEL_CODE,
    LABEL_INSTALL_FOR,
    LABEL_INSTALLATION,
    LABEL_JOB,
    LABEL_ROLE,
    LABEL_TASK,
    LABEL_TASK_INDEX,
    LABEL_TASK_TYPE,
    LABEL_TRIAL,
)
from aiptrain.logs import parse_engine_time
from aiptrain.planning import (
    LONE_HOSTNAME,
    ContainerSpec,
    LaunchPlan,
    NetworkSpec,
)
from aiptrain.settings import DEFAULT_SUBNET_POOL, Settings
from aiptrain.storage.endpoint import (
    API_HOSTS,
    AWAIT_ENDPOINT,
    ENDPOINT_PORT,
    REPLICA_PORT,
    ROLE,
)

log = logging.getLogger(__name__)
TMPFS_OPTIONS = "rw,nosuid,nodev,exec,size=4g"
_EXIT_STATUS = re.compile(r"Exited \((-?\d+)\)")
# The engine's container states as replica states; any other ("exited", "dead") is EXITED.
_STATES = {"created": ReplicaStatus.CREATED, "running": ReplicaStatus.RUNNING,
           "restarting": ReplicaStatus.RUNNING, "paused": ReplicaStatus.RUNNING}
# Addresses a job's subnet reserves besides its replicas: network, gateway, broadcast.
RESERVED_ADDRESSES = 3
SMALLEST_SUBNET = 29  # 8 addresses: 5 replicas
SUBNET_ATTEMPTS = 8  # a concurrent submit may take the subnet we picked: pick again
NETWORK_PATIENCE_SECONDS = 120  # a busy Docker 20.10 engine took over a minute to release a PREMIUM_1 network
# A network refused for "active endpoints" while the engine lists none on it, this long: Docker's
# count of its endpoints is wrong (replicas that exit while others start or exit can leave it so
# on 20.10: a PREMIUM_1 job whose trainer exits at once, one in eight), for minutes to an hour or
# more (seen: over 4 and under 31 minutes in a test of its own, up to about 80 in benchmark runs),
# or until dockerd restarts. Waiting out NETWORK_PATIENCE_SECONDS then delayed the job's end.
STALE_COUNT_SECONDS = 5.0
DEFAULT_NETWORK = "bridge"  # the engine's own network, never created or removed here
# The installation's network for lone replicas: inter-container traffic off, so one BASIC job
# cannot reach another's ports; sized for many lone replicas at once.
SOLO_NETWORK_ADDRESSES = 1000
SOLO_OPTIONS = {"com.docker.network.bridge.enable_icc": "false"}
SOLO_ROLE = "solo-network"
LABEL_HOME = "aiptrain.home"  # on every container and network made here: the home it belongs to
SOLO_PREFIX = "aiptrain-solo"
# A lone replica starts inside a network namespace made ready before its job came: a "holder"
# container asleep on the solo network, whose network the replica joins (network mode
# container:<holder>). A container's start on a user-defined bridge network costs the engine
# its network set-up (0.44 s against 0.16 s for one joining a holder, measured here), most of a
# BASIC job's start. The home's controller keeps one ready; each holder serves one replica and
# goes with it.
HOLDER_ROLE = "network-holder"
HOLDER_MEMORY = 32 * 1024 * 1024  # `sleep` needs under one
# After a launch the next holder waits a moment, so its start does not compete with the
# trainer's for the cores; after a teardown it is made at once.
HOLDER_AFTER_LAUNCH_SECONDS = 1.0
ENDPOINT_READY_SECONDS = 20


class NoEndpointImage(EnvironmentNotReady):
    """No image on the engine can run the storage endpoint."""


# One low-level client per process and timeout (its connection pool is thread-safe): a submit
# asked for one in three places, and each new client costs a connection and a version request.
_CLIENTS: dict[tuple[int, tuple], object] = {}
# Where the engine is, as the docker CLI reads it (docker.utils.kwargs_from_env).
ENGINE_VARIABLES = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")
_CLIENTS_LOCK = threading.Lock()
os.register_at_fork(after_in_child=_CLIENTS.clear)  # a forked child never shares its parent's sockets


# Within one submit several checks inspect the same image (the runtime's contents, the backend's
# readiness, the install's key): inside `inspections_shared()` they share one answer per image.
_SHARED_INSPECTIONS: contextvars.ContextVar[dict[str, dict] | None] = contextvars.ContextVar(
    "shared_image_inspections", default=None)


@contextlib.contextmanager
def inspections_shared() -> Iterator[None]:
    token = _SHARED_INSPECTIONS.set({})
    try:
        yield
    finally:
        _SHARED_INSPECTIONS.reset(token)


def inspect_image(api, image: str) -> dict:
    """The engine's record of an image (ImageNotFound when it has none), asked once per image
    inside `inspections_shared()`."""
    shared = _SHARED_INSPECTIONS.get()
    if shared is None:
        return api.inspect_image(image)
    if image not in shared:
        shared[image] = api.inspect_image(image)
    return shared[image]


def engine_is_local() -> bool:
    """Whether the engine is this host's own (its Unix socket), not one DOCKER_HOST names elsewhere."""
    host = os.environ.get("DOCKER_HOST", "")
    return not host or host.startswith("unix://")


def connect(timeout: int = 120):
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


def subnet_pool(value: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(value)
    except ValueError:
        raise ValidationError(
            f"AIPTRAIN_SUBNET_POOL [{value}] is not an IPv4 network: set it to a range such as 198.18.0.0/15."
        ) from None


def subnet_prefix(replicas: int) -> int:
    """The longest prefix whose subnet holds the replicas, the gateway, network and broadcast."""
    return min(SMALLEST_SUBNET, 32 - (replicas + RESERVED_ADDRESSES - 1).bit_length())


def pick_subnet(pool: ipaddress.IPv4Network, replicas: int, taken: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network],
                seed: str) -> ipaddress.IPv4Network | None:
    """A subnet of the pool sized for the replicas and overlapping none taken, or None. The
    search starts at a place derived from `seed` (the network's name), so concurrent submits
    rarely pick the same one."""
    prefix = subnet_prefix(replicas)
    if prefix < pool.prefixlen:
        return None
    count = 1 << (prefix - pool.prefixlen)
    size = 1 << (32 - prefix)
    start = zlib.crc32(seed.encode()) % count
    base = int(pool.network_address)
    nearby = [t for t in taken if t.version == 4 and t.overlaps(pool)]
    for step in range(count):
        candidate = ipaddress.IPv4Network((base + ((start + step) % count) * size, prefix))
        if not any(candidate.overlaps(t) for t in nearby):
            return candidate
    return None


class StaleCountWatch:
    """Tells, from a network's refusals and what the engine lists on it, when Docker's count of
    its endpoints is stale (STALE_COUNT_SECONDS of "active endpoints" with none listed). A
    swarm's "in use" is never stale: its tasks elsewhere are not listed on this node."""

    def __init__(self) -> None:
        self._empty_since: float | None = None

    def stale(self, refusal: str, listed: int, now: float) -> bool:
        if listed or "active endpoints" not in refusal:
            self._empty_since = None
            return False
        if self._empty_since is None:
            self._empty_since = now
        return now - self._empty_since > STALE_COUNT_SECONDS


def _network_kept(network_id: str, although: str, cause: str) -> AiptrainError:
    short = network_id[:12]
    return AiptrainError(
        f"Docker keeps the job's network {short} although {although} ({cause}, an engine fault that restarting "
        f"dockerd clears): the home's controller removes it once Docker lets it go, or remove it with "
        f"`docker network rm {short}` then."
    )


def host_gateway(api) -> str | None:
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


@dataclass(frozen=True)
class HolderRecipe:
    """How to make a lone replica's network holder: what its last lone launch used."""

    images: tuple[str, ...]  # the storage endpoint's: the first one here runs it
    user: str
    network: str  # the solo network
    gateway: str  # where Google's API hosts resolve: the storage endpoint


@dataclass(frozen=True)
class ReadyHolder:
    container_id: str
    gateway: str


def holders_used(containers: Iterable[dict]) -> set[str]:
    """The holders whose network these containers joined (network mode container:<ID>)."""
    modes = ((c.get("HostConfig") or {}).get("NetworkMode") or "" for c in containers)
    return {mode.removeprefix("container:") for mode in modes if mode.startswith("container:")}


class DockerBackend:
    name = "docker"
    # Bind mounts of this host's directories reach every replica: packages can be installed
    # once here (aiptrain.installs) and mounted into all of them.
    host_dirs_reach_replicas = True
    network_options: ClassVar[dict] = {"driver": "bridge"}  # how a job's network is created
    logs_path = "/containers/{0}/logs"  # the engine's log endpoint of one replica

    def __init__(self, installation: str | None = None, client=None, subnet_pool: str = DEFAULT_SUBNET_POOL,
                 home: str | None = None):
        self._installation = installation
        self._client = client
        self._subnet_pool = subnet_pool
        self._connecting = threading.Lock()
        self._home = home  # labels all this makes, so what a deleted home left can be found
        # Network holders (see HOLDER_ROLE): kept only by the process that launches (warm_up).
        self._holders = threading.Lock()  # guards the four below
        self._keeps_holders = False
        self._ready_holder: ReadyHolder | None = None
        self._holder_recipe: HolderRecipe | None = None  # from the last lone launch
        self._holders_in_hand: set[str] = set()  # taken by a launch, not yet joined by its replica
        self._making_holder = False
        self._holder_timer: tuple[threading.Timer, float] | None = None  # the next make, and when it is due

    @classmethod
    def from_settings(cls, settings: Settings) -> DockerBackend:
        """The backend of one aiptrain home: its installation and its subnet pool."""
        return cls(settings.installation_id, subnet_pool=settings.subnet_pool, home=str(settings.home))

    @property
    def api(self):
        with self._connecting:  # submit warms up from a second thread: connect once
            if self._client is None:
                self._client = connect()
        return self._client

    def host_address(self) -> str | None:
        """This host's address as replicas reach it (e.g. for an emulator running here)."""
        return host_gateway(self.api)

    # -- readiness -----------------------------------------------------------------------

    def warm_up(self, launches: bool = False) -> None:
        """Connect ahead of need; a failure shows up on first real use. The process that
        launches keeps a lone replica's network ready from now on (HOLDER_ROLE)."""
        if launches:
            self._keeps_holders = True
        try:
            self.api  # noqa: B018 - the property connects
        except Exception:  # noqa: BLE001 - reported by the call that needs the engine
            pass

    def check_ready(self, plan: LaunchPlan) -> None:
        subnet_pool(self._subnet_pool)
        self._check_images(plan)
        if any(c.gpus for c in plan.containers) and not self.has_gpu_runtime():
            raise EnvironmentLacks(
                "This job asks for GPUs but the Docker engine has no GPU runtime: install the "
                "NVIDIA Container Toolkit, or submit without accelerators."
            )

    def has_gpu_runtime(self) -> bool:
        return "nvidia" in self.api.info().get("Runtimes", {})

    def _check_images(self, plan: LaunchPlan, where: str = "") -> None:
        from docker.errors import ImageNotFound

        for image in sorted({c.image for c in plan.containers}):
            try:
                inspect_image(self.api, image)
            except ImageNotFound:
                raise EnvironmentNotReady(
                    f"Image [{image}] is not on this Docker engine{where}: build or load it first "
                    "(runtime images: `aiptrain runtimes build VERSION`)."
                ) from None

    # -- launch --------------------------------------------------------------------------

    def launch(self, plan: LaunchPlan) -> None:
        """The job's network and replicas. Replicas are made and started while the storage
        endpoint comes up (in a new home, or after a quiet spell, it takes the longest: about
        half a second); their bootstrap waits for it to listen before the trainer runs, since a
        trainer's first request may come at once and not every client retries a refused
        connection. A replica without the bootstrap (a custom container's own command) is
        started once the endpoint serves."""
        with self._removed_on_failure(plan), ThreadPoolExecutor(max_workers=1) as endpoint_starter:
            # A job without a network of its own runs on the solo network, whose gateway is where
            # the storage endpoint listens.
            solo, gateway = self.solo_network() if not plan.network or plan.storage else ("", "")
            serving, hosts = None, None
            if plan.storage and gateway and self._endpoint_image_present(plan.storage):
                serving = endpoint_starter.submit(self.ensure_storage_endpoint, plan.storage)
                hosts = dict.fromkeys(API_HOSTS, gateway)
            if plan.network:
                self._create_network(plan.network)
            network = plan.network.name if plan.network else solo
            lone_at_endpoint = not plan.network and hosts is not None  # what holders are made for
            holder = self._take_holder(gateway) if lone_at_endpoint else None
            # Until the endpoint's port is published, a replica's connection there reaches the host.
            early = serving is not None and not serving.done() and not host_listens(gateway, REPLICA_PORT)

            def create_then_start(spec: ContainerSpec) -> None:
                env, start_after = plan.environment(spec), serving
                if early and serving and not serving.done() and spec.runs_bootstrap:  # it waits itself
                    env, start_after = {**env, AWAIT_ENDPOINT: f"{API_HOSTS[1]}:{REPLICA_PORT}"}, None
                if holder and self._start_in_holder(spec, env, holder, start_after):
                    return
                container_id = self._create(spec, env, network, hosts, bool(plan.network))
                if start_after:
                    start_after.result()
                self.api.start(container_id)

            try:
                self._each(create_then_start, plan.containers)
                if serving:
                    serving.result()  # an endpoint that never serves fails the launch
            except BaseException:
                if holder:
                    self._remove_containers([holder])
                raise
            finally:
                self._let_go_of(holder)
        if lone_at_endpoint and plan.storage:
            self._keep_holder_ready(HolderRecipe(plan.storage.images, plan.storage.user, solo, gateway),
                                    HOLDER_AFTER_LAUNCH_SECONDS)

    # -- shared per installation: the lone replicas' network, the storage endpoint ------------------

    def _installation_labels(self, role: str) -> dict[str, str]:
        owner = {LABEL_INSTALLATION: self._installation} if self._installation else {}
        return {**owner, LABEL_ROLE: role}

    def _with_home(self, labels: dict[str, str]) -> dict[str, str]:
        """`labels` and the home this backend works for, which `remove_abandoned` goes by."""
        return {**labels, LABEL_HOME: self._home} if self._home else labels

    @property
    def solo_network_name(self) -> str:
        return f"{SOLO_PREFIX}-{self._installation[:8]}" if self._installation else SOLO_PREFIX

    def solo_network(self) -> tuple[str, str]:
        """(id, gateway address) of the installation's network for lone replicas, created on
        first need. Creation is serialized by a lock in the home: the engine does not refuse a
        second network of the same name made at the same moment. Should duplicates exist (homes
        without a lock file), the oldest is the one, and the others are removed when empty."""
        with self._home_lock("solo-network"):
            networks = self._solo_networks()
            if not networks:
                self._create_network(NetworkSpec(self.solo_network_name, self._installation_labels(SOLO_ROLE),
                                                 SOLO_NETWORK_ADDRESSES), options=SOLO_OPTIONS)
                networks = self._solo_networks()
        if not networks:
            raise EnvironmentNotReady(f"Docker did not keep the network {self.solo_network_name}: try again.")
        keep, *duplicates = networks
        for duplicate in duplicates:
            with contextlib.suppress(Exception):
                self.api.remove_network(duplicate["Id"])
        config = keep["IPAM"]["Config"][0]
        gateway = config.get("Gateway") or str(ipaddress.ip_network(config["Subnet"], strict=False)[1])
        return keep["Id"], gateway.split("/")[0]

    def _solo_networks(self) -> list[dict]:
        found = self.api.networks(names=[self.solo_network_name], filters={"label": f"{LABEL_ROLE}={SOLO_ROLE}"})
        return sorted((n for n in found if n["Name"] == self.solo_network_name), key=lambda n: n["Created"])

    # -- network holders: a lone replica's network, made ready before its job (HOLDER_ROLE) -------

    def _take_holder(self, gateway: str) -> str | None:
        """The ready holder's ID, taken for one replica, if its network is the one wanted (the
        solo network made again since is not: that holder goes)."""
        with self._holders:
            holder, self._ready_holder = self._ready_holder, None
            if holder is not None and holder.gateway == gateway:
                self._holders_in_hand.add(holder.container_id)
                return holder.container_id
        if holder is not None:
            self._remove_containers([holder.container_id])
        return None

    def _let_go_of(self, holder: str | None) -> None:
        """The launch is done with the holder it took: its replica uses it, or it is gone."""
        if holder:
            with self._holders:
                self._holders_in_hand.discard(holder)

    def _start_in_holder(self, spec: ContainerSpec, env: dict[str, str], holder: str, serving) -> bool:
        """Start the replica in the holder's network (its hostname is LONE_HOSTNAME). False when
        the holder cannot serve (an engine restart stopped it): what was made goes, and the
        replica makes its own network."""
        from docker.errors import APIError

        try:
            container_id = self._create(spec, env, f"container:{holder}")
            if serving:
                serving.result()
            self.api.start(container_id)
            return True
        except APIError as exc:
            log.info("A lone replica could not join its ready network (%s): it makes its own.", engine_error(exc))
        self._remove_containers([spec.name, holder])
        return False

    def _keep_holder_ready(self, recipe: HolderRecipe | None, delay: float) -> None:
        """Make the next lone replica's holder in the background, after `delay`, unless one is
        ready, being made, or due sooner (a burst of launches takes the first holder and makes
        its own networks)."""
        with self._holders:
            self._holder_recipe = recipe or self._holder_recipe
            if not self._keeps_holders or self._holder_recipe is None or self._ready_holder or self._making_holder:
                return
            due = time.monotonic() + delay
            if self._holder_timer is not None:
                pending, pending_due = self._holder_timer
                if pending_due <= due:
                    return
                pending.cancel()
            timer = threading.Timer(delay, self._make_holder)
            timer.daemon = True
            self._holder_timer = (timer, due)
        timer.start()

    def _make_holder(self) -> None:
        with self._holders:
            if self._making_holder or self._ready_holder:  # a timer cancelled too late
                return
            self._making_holder, self._holder_timer = True, None
            recipe = self._holder_recipe
        holder = None
        try:
            if recipe is not None:
                holder = ReadyHolder(self._start_holder(recipe), recipe.gateway)
        except Exception as exc:  # noqa: BLE001 - only a speed-up: a launch without one makes its own network
            log.info("Could not make a network ready for the next lone replica: %s", exc)
        with self._holders:
            self._making_holder = False
            keep = holder is not None and self._keeps_holders and self._ready_holder is None
            if keep:
                self._ready_holder = holder
        if holder is not None and not keep:  # the controller let go of the engine meanwhile
            self._remove_containers([holder.container_id])

    def _start_holder(self, recipe: HolderRecipe) -> str:
        """A holder: asleep on the solo network with the lone replicas' hostname and their extra
        hosts (Google's API hosts at the storage endpoint), unprivileged like a replica."""
        host_config = self.api.create_host_config(
            network_mode=recipe.network, extra_hosts=dict.fromkeys(API_HOSTS, recipe.gateway), read_only=True,
            cap_drop=["ALL"], security_opt=["no-new-privileges"], pids_limit=8, mem_limit=HOLDER_MEMORY,
        )
        owner = {LABEL_INSTALLATION: self._installation} if self._installation else {}
        container = self.api.create_container(  # the base image first: it is aiptrain's, not a job's
            self._present_image(tuple(reversed(recipe.images))), command=["sleep", "infinity"], user=recipe.user,
            hostname=LONE_HOSTNAME, labels=self._with_home({**owner, LABEL_ROLE: HOLDER_ROLE}),
            host_config=host_config,
        )
        self.api.start(container["Id"])
        return container["Id"]

    def _replace_holders(self, used: set[str]) -> None:
        """Remove the holders a job's replicas used and make the next one ready: in the
        background, as the job's end need not wait for either (a holder left by a controller
        that died meanwhile is removed by the next one's sweep, `_remove_idle_holders`)."""
        self._remove_containers(used)
        self._keep_holder_ready(None, 0.0)

    def _remove_containers(self, container_ids: Iterable[str]) -> None:
        """Remove these containers (IDs or names) by force; those gone meanwhile are fine."""
        from docker.errors import APIError, NotFound

        for container_id in container_ids:
            with contextlib.suppress(NotFound, APIError):  # gone meanwhile
                self.api.remove_container(container_id, force=True)

    def _remove_idle_holders(self) -> None:
        """This home's holders that no replica uses, but the one kept ready: what a controller
        that died (or a launch that failed) left."""
        if not self._installation:
            return
        owner = f"{LABEL_INSTALLATION}={self._installation}"
        containers = self.api.containers(all=True, filters={"label": [owner]})
        used = holders_used(containers)
        with self._holders:
            if self._making_holder:  # one being made is not ready yet, nor used: the next sweep looks
                return
            used |= {*self._holders_in_hand, *([self._ready_holder.container_id] if self._ready_holder else [])}
            idle = [c["Id"] for c in containers
                    if (c.get("Labels") or {}).get(LABEL_ROLE) == HOLDER_ROLE and c["Id"] not in used]
        self._remove_containers(idle)

    def _stop_keeping_holders(self) -> None:
        """The controller lets go of the engine: no more holders, and the ready one goes."""
        with self._holders:
            self._keeps_holders = False
            ready, self._ready_holder = self._ready_holder, None
        if ready:
            self._remove_containers([ready.container_id])

    def remove_abandoned(self, active_jobs: Callable[[], Collection[str]] | None = None) -> None:
        """What homes deleted from this host left on its engine when no controller of theirs ran
        to remove it (their storage endpoint, their replicas, which exit on their own, and the
        networks: each holds a subnet of AIPTRAIN_SUBNET_POOL for good, and a machine that makes
        a fresh home per CI run used to exhaust the pool, 128 of them). Only on an engine of
        this host (a home on another machine is not this one's to judge), and only what no
        trainer uses: a replica still running stays, and so does its network. Given this home's
        `active_jobs`, also what this home's own ended jobs left (`_remove_kept_networks`)."""
        from docker.errors import APIError, NotFound

        self._remove_idle_holders()
        if active_jobs is not None:
            self._remove_kept_networks(active_jobs)
        if not engine_is_local():
            return
        containers = self.api.containers(all=True, filters={"label": LABEL_HOME})
        networks = self.api.networks(filters={"label": LABEL_HOME})
        gone = {home for home in ((item.get("Labels") or {}).get(LABEL_HOME, "") for item in [*containers, *networks])
                if self._deleted(home)}
        in_use = holders_used(containers)
        for item in [*containers, *networks]:  # containers first: a network with one on it stays
            labels = item.get("Labels") or {}
            if labels.get(LABEL_HOME) not in gone:
                continue
            role = labels.get(LABEL_ROLE)
            with contextlib.suppress(NotFound, APIError):  # in use, or gone meanwhile
                if "Driver" in item:  # a network
                    self.api.remove_network(item["Id"])
                elif role == ROLE or (role == HOLDER_ROLE and item["Id"] not in in_use) or item.get("State") != "running":
                    self.api.remove_container(item["Id"], force=True)  # the endpoint, an idle holder, or done
        if gone:
            log.info("Removed what %d deleted home(s) left on the engine: %s", len(gone), ", ".join(sorted(gone)))

    def _remove_kept_networks(self, active_jobs: Callable[[], Collection[str]]) -> None:
        """Networks of this home's jobs that have ended: the engine kept them at the teardown (a
        stale endpoint, which restarting dockerd clears), each holding a subnet of the pool. The
        jobs are asked for after the networks are listed: a network listed belongs to a job
        recorded before it, so a job launching meanwhile is among the active ones."""
        from docker.errors import APIError

        if not self._home:
            return
        owner = [f"{LABEL_INSTALLATION}={self._installation}"] if self._installation else []
        networks = self.api.networks(filters={"label": [f"{LABEL_HOME}={self._home}", LABEL_JOB, *owner]})
        if not networks:
            return
        active = set(active_jobs())
        for network in networks:
            job_id = (network.get("Labels") or {}).get(LABEL_JOB, "")
            if job_id in active:
                continue
            try:
                self.api.remove_network(network["Id"])
            except APIError as exc:  # gone meanwhile (NotFound), or kept still: the next sweep tries again
                log.info("The network %s of ended job %s stays for now: %s", network["Name"], job_id, engine_error(exc))
                continue
            log.info("Removed the network %s that the engine had kept after job %s ended.", network["Name"], job_id)

    def _deleted(self, home: str) -> bool:
        """Whether `home` (a LABEL_HOME value) names another home, no longer on this host."""
        return bool(home) and home != self._home and not os.path.isdir(home)

    @contextlib.contextmanager
    def _home_lock(self, what: str) -> Iterator[None]:
        """One process of this home at a time makes `what` (a lock file in the home)."""
        if not self._home or not os.path.isdir(self._home):
            yield
            return
        import fcntl

        with open(os.path.join(self._home, f".{what}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _endpoint_image_present(self, endpoint) -> bool:
        """Whether an image here can run the storage endpoint. Without one the job runs without
        it (its gs:// fails as offline), said in the log."""
        try:
            self._present_image(endpoint.images)
            return True
        except NoEndpointImage as exc:
            log.warning("%s", exc)
            return False

    def ensure_storage_endpoint(self, endpoint) -> str:
        """The address replicas reach the installation's storage endpoint at (port 443): the lone
        replicas' network gateway, where its port is published. Started if absent, replaced if it
        died, runs older code, or publishes elsewhere; one per installation (by name)."""
        from docker.errors import APIError, NotFound

        # A new home's TLS files (cryptography's import is most of their time) are made while the
        # engine makes the network.
        with ThreadPoolExecutor(max_workers=1) as files:
            made = files.submit(endpoint.prepare_files)
            _, gateway = self.solo_network()
            made.result()
        with self._home_lock("storage-endpoint"):  # concurrent launches: one starts it, the others find it
            for _ in range(3):
                try:
                    info = self.api.inspect_container(endpoint.name)
                except NotFound:
                    info = None
                if info and self._endpoint_current(info, endpoint.labels[LABEL_CODE], gateway):
                    return gateway
                if info:
                    with contextlib.suppress(NotFound):
                        self.api.remove_container(info["Id"], force=True)
                try:
                    self._start_endpoint(endpoint, gateway)
                except APIError as exc:
                    if exc.status_code == 409:  # another home's process with no lock file: look again
                        time.sleep(0.2)
                        continue
                    raise AiptrainError(f"Could not start the storage endpoint for gs://: {engine_error(exc)}") from None
                self._wait_listening(endpoint.name)
                return gateway
        raise EnvironmentNotReady(f"The storage endpoint {endpoint.name} keeps changing: try again.")

    def release_shared(self, still_needed: Callable[[], bool]) -> None:
        """What the installation's jobs share never outlives them: the storage endpoint and the
        lone replicas' network (a /22 of the subnet pool, held for good by every home kept on
        disk otherwise) are removed when the last active job ends; the next launch makes them
        again (the endpoint about half a second, the network 0.07 s). Under the locks a launch
        makes them with, so a job recorded before its launch keeps them."""
        if not self._installation or not self._home:
            return
        from docker.errors import APIError

        owner = f"{LABEL_INSTALLATION}={self._installation}"
        self._stop_keeping_holders()
        with self._home_lock("solo-network"), self._home_lock("storage-endpoint"):
            if still_needed():
                return
            self._remove_containers(c["Id"] for c in self.api.containers(
                all=True, filters={"label": [owner, f"{LABEL_ROLE}={ROLE}"]}))
            self._remove_idle_holders()
            for network in self._solo_networks():
                try:
                    self.api.remove_network(network["Id"])
                except APIError as exc:  # a holder still being made, a container still leaving: the next release
                    log.info("Kept the lone replicas' network for now: %s", engine_error(exc))

    @staticmethod
    def _endpoint_current(info: dict, code: str, gateway: str) -> bool:
        bindings = ((info.get("HostConfig") or {}).get("PortBindings") or {}).get(f"{ENDPOINT_PORT}/tcp") or []
        alive = info["State"].get("Running") or info["State"].get("Restarting")  # the engine brings it back
        return bool(alive and info["Config"]["Labels"].get(LABEL_CODE) == code
                    and any(b.get("HostIp") == gateway for b in bindings))

    def _start_endpoint(self, endpoint, gateway: str) -> None:
        """The endpoint container: unprivileged like a replica (read-only root, no capabilities),
        the replicas' user, only the gcs tree writable; restarted by the engine if it dies."""
        from docker.types import Mount

        image = self._present_image(endpoint.images)
        host_config = self.api.create_host_config(
            mounts=[Mount(target, source, type="bind", read_only=ro) for source, target, ro in endpoint.mounts()],
            port_bindings={ENDPOINT_PORT: (gateway, REPLICA_PORT)},
            network_mode=DEFAULT_NETWORK, init=True, read_only=True, tmpfs={"/tmp": TMPFS_OPTIONS},
            cap_drop=["ALL"], security_opt=["no-new-privileges"], restart_policy={"Name": "unless-stopped"},
            pids_limit=512,
        )
        labels = self._with_home(endpoint.labels)
        container = self.api.create_container(
            image, command=endpoint.command, user=endpoint.user, labels=labels, name=endpoint.name,
            working_dir="/tmp", environment={"PYTHONDONTWRITEBYTECODE": "1"}, ports=[ENDPOINT_PORT],
            host_config=host_config,
        )
        self.api.start(container["Id"])

    def _present_image(self, images: tuple[str, ...]) -> str:
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

    def _wait_listening(self, name: str) -> None:
        """Until the endpoint says it serves (its first log line), so the replicas' first request
        finds it; a start that fails is reported with its output."""
        deadline = time.monotonic() + ENDPOINT_READY_SECONDS
        while time.monotonic() < deadline:
            output = self.api.logs(name).decode(errors="replace")
            if "serving" in output:
                return
            state = self.api.inspect_container(name)["State"]
            if not state.get("Running") and state.get("Status") == "exited":
                raise AiptrainError(f"The storage endpoint for gs:// did not start: {output.strip()[-300:]}")
            time.sleep(0.02)  # replicas wait for it: each look sooner is a look less of their start
        raise AiptrainError(f"The storage endpoint for gs:// did not start within {ENDPOINT_READY_SECONDS}s.")

    def remove_installation(self) -> None:
        """Remove what the installation shares (the storage endpoint, the lone replicas' network);
        the next launch makes them again. For tests and uninstalling."""
        if not self._installation:
            return
        self._stop_keeping_holders()
        owner = f"{LABEL_INSTALLATION}={self._installation}"
        self._remove_containers(c["Id"] for c in self.api.containers(all=True, filters={"label": [owner, LABEL_ROLE]}))
        for network in self.api.networks(filters={"label": [owner, f"{LABEL_ROLE}={SOLO_ROLE}"]}):
            self._remove_network(network["Id"])

    @contextlib.contextmanager
    def _removed_on_failure(self, plan: LaunchPlan) -> Iterator[None]:
        """A launch that fails removes what it created (of its trial only: a failed trial's
        launch leaves the other trials be) and says why in one line: the launch's own error, even
        when the engine keeps something of it (a stale endpoint holding the job's network)."""
        try:
            yield
        except BaseException as exc:
            try:
                self.remove(plan.job_id, plan.trial_id)
            except Exception as leftover:  # noqa: BLE001 - the launch's error is the one to tell
                log.warning("The failed launch of job %s left something behind: %s", plan.job_id, leftover)
            if isinstance(exc, AiptrainError | KeyboardInterrupt):
                raise
            raise _launch_error(exc) from exc

    def _create_network(self, network: NetworkSpec, options: dict | None = None) -> None:
        """The job's bridge network on a subnet of its own from the pool, sized to its replicas:
        the engine's default pools hold only about 30 networks."""
        from docker.errors import APIError
        from docker.types import IPAMConfig, IPAMPool

        pool = subnet_pool(self._subnet_pool)
        refused: list[ipaddress.IPv4Network] = []
        swept = False
        for _ in range(SUBNET_ATTEMPTS):
            subnet = pick_subnet(pool, network.addresses, [*self._subnets_in_use(), *refused], network.name)
            if subnet is None and not swept:  # deleted homes' networks may hold the pool: free theirs
                swept = True
                self.remove_abandoned()
                subnet = pick_subnet(pool, network.addresses, [*self._subnets_in_use(), *refused], network.name)
            if subnet is None:
                break
            ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=str(subnet))])
            try:
                self.api.create_network(network.name, ipam=ipam, labels=self._with_home(network.labels),
                                        check_duplicate=True, options=options, **self.network_options)
                return
            except APIError as exc:
                if "overlap" not in engine_error(exc).lower():
                    raise
                refused.append(subnet)  # taken meanwhile by a concurrent submit or another tool
        raise EnvironmentNotReady(
            f"No free subnet for {network.addresses} replica(s) in AIPTRAIN_SUBNET_POOL ({pool}): too many jobs "
            "are running; wait for some to end or set a wider pool."
        )

    def _subnets_in_use(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        subnets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for network in self.api.networks():
            for config in (network.get("IPAM") or {}).get("Config") or []:
                try:
                    subnets.append(ipaddress.ip_network(config.get("Subnet", ""), strict=False))
                except ValueError:
                    continue
        return subnets

    def _host_config(self, spec: ContainerSpec, network_mode: str, hosts: dict[str, str] | None = None) -> dict:
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

    def image_id(self, image: str) -> str:
        return inspect_image(self.api, image)["Id"]

    def run_to_completion(self, spec: ContainerSpec) -> tuple[int, str]:
        """Run a one-off container with no network (an install step) and remove it; (status, output)."""
        api = self.api
        container = api.create_container(
            spec.image, command=spec.command, entrypoint=spec.entrypoint, environment=spec.env, user=spec.user,
            working_dir=spec.working_dir, labels=self._with_home(spec.labels), host_config=self._host_config(spec, "none"),
        )
        try:
            api.start(container["Id"])
            status = api.wait(container["Id"])["StatusCode"]
            output = api.logs(container["Id"]).decode(errors="replace")
        finally:
            api.remove_container(container["Id"], force=True)
        return status, output

    def _create(self, spec: ContainerSpec, env: dict[str, str], network: str,
                hosts: dict[str, str] | None = None, aliases: bool = True) -> str:
        """The replica's container on `network`, or in a holder's (`container:<ID>`), whose
        hostname and /etc/hosts it shares: the engine refuses to set them again there."""
        api = self.api
        joins = network.startswith("container:")
        host_config = self._host_config(spec, network, None if joins else hosts)
        # A lone replica's hostname is in its own /etc/hosts: no alias tells its neighbours its name.
        endpoint = api.create_endpoint_config(aliases=[spec.hostname]) if aliases and not joins else None
        container = api.create_container(
            spec.image,
            command=spec.command,
            entrypoint=spec.entrypoint,
            environment=env,
            hostname=None if joins else spec.hostname,
            labels=self._with_home(spec.labels),
            name=spec.name,
            user=spec.user,
            working_dir=spec.working_dir,
            host_config=host_config,
            networking_config=api.create_networking_config({network: endpoint}) if endpoint else None,
        )
        return container["Id"]

    # -- observation ---------------------------------------------------------------------

    def _job_labels(self, job_id: str, trial_id: str | None = None) -> list[str]:
        """Label filters that select this job (or one of its trials) of this aiptrain home,
        nothing of another home."""
        owner = [f"{LABEL_INSTALLATION}={self._installation}"] if self._installation else []
        trial = [f"{LABEL_TRIAL}={trial_id}"] if trial_id else []
        return [f"{LABEL_JOB}={job_id}", *owner, *trial]

    def _containers(self, job_id: str, trial_id: str | None = None) -> list[dict]:
        return self.api.containers(all=True, filters={"label": self._job_labels(job_id, trial_id)})

    def observe(self, job_id: str) -> list[ReplicaObservation]:
        observations = []
        for info in self._containers(job_id):
            labels = info["Labels"]
            status = _STATES.get(info["State"], ReplicaStatus.EXITED)
            exit_code = finished = None
            if status == ReplicaStatus.EXITED:
                exit_code, finished = self._exit_details(info)
            observations.append(labelled_observation(labels, info["Id"], status, exit_code, finished))
        return observations

    def _exit_details(self, info: dict) -> tuple[int | None, datetime | None]:
        match = _EXIT_STATUS.search(info.get("Status", ""))
        code = int(match.group(1)) if match else None
        if code == 0:
            return 0, None
        # A failure: the finish time orders failures, so the first one is reported.
        from docker.errors import NotFound

        try:
            state = self.api.inspect_container(info["Id"])["State"]
        except NotFound:
            return code, None
        finished_ns = parse_engine_time(state["FinishedAt"])
        return state["ExitCode"], datetime.fromtimestamp(finished_ns / 1e9).astimezone()

    # -- control -------------------------------------------------------------------------

    def restart(self, container_id: str) -> None:
        self.api.start(container_id)

    def stop(self, container_ids: list[str], grace_seconds: int = 10) -> None:
        from docker.errors import NotFound

        def stop_one(container_id: str) -> None:
            try:
                self.api.stop(container_id, timeout=grace_seconds)
            except NotFound:
                pass

        self._each(stop_one, container_ids)

    def remove(self, job_id: str, trial_id: str | None = None) -> None:
        from docker.errors import APIError, NotFound

        def remove_one(container: dict) -> None:
            # Leaving the network first, while the container exists: removing replicas that
            # are still exiting can leave a stale endpoint that blocks the network's removal.
            for network in ((container.get("NetworkSettings") or {}).get("Networks") or {}):
                if network in (DEFAULT_NETWORK, self.solo_network_name):
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

        containers = self._containers(job_id, trial_id)
        if trial_id is None:  # and the job's install container, if a killed submit left it
            owner = [f"{LABEL_INSTALLATION}={self._installation}"] if self._installation else []
            containers += self.api.containers(all=True, filters={"label": [f"{LABEL_INSTALL_FOR}={job_id}", *owner]})
        self._each(remove_one, containers)
        holders = holders_used(containers)
        if holders:  # after their replicas, which used them
            threading.Thread(target=self._replace_holders, args=(holders,), daemon=True).start()
        for network in self.api.networks(filters={"label": self._job_labels(job_id, trial_id)}):
            self._remove_network(network["Id"])

    def _remove_network(self, network_id: str) -> None:
        """Remove a job's network once its containers are gone. A busy engine can still list
        endpoints of containers it has just removed ("has active endpoints"; a swarm's tasks
        that are shutting down: "in use"): those are disconnected by force and the removal
        tried again, for a while. A network refused while it lists no endpoint at all has a
        stale count (STALE_COUNT_SECONDS): kept at once, for the sweep to remove later."""
        from docker.errors import APIError, NotFound

        deadline = time.monotonic() + NETWORK_PATIENCE_SECONDS
        watch = StaleCountWatch()
        while True:
            try:
                self.api.remove_network(network_id)
                return
            except NotFound:
                return
            except APIError as exc:
                refusal = engine_error(exc)
                if not any(busy in refusal for busy in ("active endpoints", "in use")):
                    raise
            if time.monotonic() > deadline:
                raise _network_kept(network_id, "its replicas are gone",
                                    f"it still lists endpoints after {NETWORK_PATIENCE_SECONDS} s")
            if watch.stale(refusal, self._disconnect_all(network_id), time.monotonic()):
                raise _network_kept(network_id, "nothing is on it any more", "a stale count of its endpoints")
            time.sleep(0.2)

    def _disconnect_all(self, network_id: str) -> int:
        """Disconnect by force every endpoint the engine lists on the network; how many it listed."""
        from docker.errors import APIError, NotFound

        try:
            endpoints = self.api.inspect_network(network_id).get("Containers") or {}
        except NotFound:
            return 0
        for endpoint in endpoints:
            try:
                self.api.disconnect_container_from_network(endpoint, network_id, force=True)
            except (APIError, NotFound):
                pass  # gone meanwhile, or still being released: the next attempt tells
        return len(endpoints)

    @staticmethod
    def _each(action, items) -> None:
        """`action` on every item, 32 at a time; the first failure is raised."""
        if not items:
            return
        with ThreadPoolExecutor(max_workers=min(32, len(items))) as pool:
            list(pool.map(action, items))

    def watch(self, stop: threading.Event, on_change: Callable[[str], None]) -> None:
        """Call `on_change(job_id)` whenever a replica of this installation starts or dies, until
        `stop` is set: the controller steps that job at once instead of at its next poll."""
        from docker.errors import DockerException
        from requests.exceptions import RequestException

        owner = f"{LABEL_INSTALLATION}={self._installation}" if self._installation else LABEL_JOB
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

    # -- logs ----------------------------------------------------------------------------

    def follow_logs(self, container_id: str, since_ns: int | None = None) -> Iterator[list[LogChunk]]:
        """Every log line of the container from `since_ns` on, following until it stops, in
        batches: the lines that had arrived together."""
        yield from read_log_lines(functools.partial(self._log_frames, container_id), since_ns)

    def _log_frames(self, replica_id: str, since_ns: int | None,
                    follow: bool) -> Iterator[list[tuple[int, bytes]]]:
        response = self._open_logs(replica_id, since_ns, follow)
        try:
            yield from frame_blocks(body_blocks(response))
        finally:
            response.close()

    def _open_logs(self, replica_id: str, since_ns: int | None, follow: bool):
        """The engine's log messages, stdout and stderr apart: docker-py's logs() merges them, and
        the severity of a line depends on its stream, so the multiplexed frames are read directly."""
        api = self.api
        params: dict[str, int | str] = {"follow": int(follow), "stdout": 1, "stderr": 1, "timestamps": 1}
        if since_ns:
            params["since"] = f"{since_ns // 1_000_000_000}.{since_ns % 1_000_000_000:09d}"
        response = api._get(api._url(self.logs_path, replica_id), params=params, stream=True)
        api._raise_for_status(response)
        if follow:
            api._disable_socket_timeout(api._get_raw_response_socket(response))  # follow may wait long
        return response


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


def _launch_error(exc: BaseException) -> AiptrainError:
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



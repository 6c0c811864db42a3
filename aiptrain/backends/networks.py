"""Job networks on one engine: subnets from AIPTRAIN_SUBNET_POOL, their removal (and Docker's
stale count of endpoints), and the installation's network for lone replicas (whose holders,
aiptrain.backends.holders, keep a lone replica's network ready before its job comes).

A job of two or more replicas gets a user-defined network of its own (a bridge on one engine,
an attachable overlay on a swarm); lone replicas share one network per installation on which
containers cannot reach each other (inter-container traffic off: planning.own_network), created
on first need, never removed by a job, and released with the storage endpoint when the home's
controller goes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import time
import zlib
from collections.abc import Callable, Sequence

from aiptrain.backends.engine import Engine, engine_error
from aiptrain.errors import AiptrainError, EnvironmentNotReady, ValidationError
from aiptrain.labels import LABEL_ROLE
from aiptrain.planning import NetworkSpec
from aiptrain.settings import DEFAULT_SUBNET_POOL

log = logging.getLogger(__name__)
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
# The installation's network for lone replicas: inter-container traffic off, so one BASIC job
# cannot reach another's ports; sized for many lone replicas at once.
SOLO_NETWORK_ADDRESSES = 1000
SOLO_OPTIONS = {"com.docker.network.bridge.enable_icc": "false"}
SOLO_ROLE = "solo-network"
SOLO_PREFIX = "aiptrain-solo"


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


class Networks:
    """The engine's job networks as one home makes them: `options` say how (a bridge; a swarm's
    attachable overlay). `free_pool` is what a full pool tries once before it refuses: the
    owner's sweep of what deleted homes left (set by whoever holds both)."""

    def __init__(self, engine: Engine, subnet_pool: str = DEFAULT_SUBNET_POOL,
                 options: dict[str, object] | None = None):
        self.engine = engine
        self.subnet_pool = subnet_pool
        self.options = options if options is not None else {"driver": "bridge"}
        self.free_pool: Callable[[], None] = lambda: None

    def check_pool(self) -> None:
        subnet_pool(self.subnet_pool)

    def create(self, network: NetworkSpec, options: dict | None = None) -> None:
        """The job's network on a subnet of its own from the pool, sized to its replicas: the
        engine's default pools hold only about 30 networks."""
        from docker.errors import APIError
        from docker.types import IPAMConfig, IPAMPool

        pool = subnet_pool(self.subnet_pool)
        refused: list[ipaddress.IPv4Network] = []
        swept = False
        for _ in range(SUBNET_ATTEMPTS):
            subnet = pick_subnet(pool, network.addresses, [*self._subnets_in_use(), *refused], network.name)
            if subnet is None and not swept:  # deleted homes' networks may hold the pool: free theirs
                swept = True
                self.free_pool()
                subnet = pick_subnet(pool, network.addresses, [*self._subnets_in_use(), *refused], network.name)
            if subnet is None:
                break
            ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=str(subnet))])
            try:
                self.engine.api.create_network(network.name, ipam=ipam, labels=self.engine.with_home(network.labels),
                                               check_duplicate=True, options=options, **self.options)
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
        for network in self.engine.api.networks():
            for config in (network.get("IPAM") or {}).get("Config") or []:
                try:
                    subnets.append(ipaddress.ip_network(config.get("Subnet", ""), strict=False))
                except ValueError:
                    continue
        return subnets

    def remove_job_networks(self, job_id: str, trial_id: str | None = None) -> None:
        for network in self.engine.api.networks(filters={"label": self.engine.job_labels(job_id, trial_id)}):
            self.remove(network["Id"])

    def remove(self, network_id: str) -> None:
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
                self.engine.api.remove_network(network_id)
                return
            except NotFound:
                return
            except APIError as exc:
                refusal = engine_error(exc)
                # A swarm's overlay answers 500 "not found" while this node releases its copy of it:
                # gone when no longer listed, else tried again like a busy one.
                if "not found" in refusal and not self._listed(network_id):
                    return
                if not any(busy in refusal for busy in ("active endpoints", "in use", "not found")):
                    raise
            if time.monotonic() > deadline:
                raise _network_kept(network_id, "its replicas are gone",
                                    f"it still lists endpoints after {NETWORK_PATIENCE_SECONDS} s")
            if watch.stale(refusal, self._disconnect_all(network_id), time.monotonic()):
                raise _network_kept(network_id, "nothing is on it any more", "a stale count of its endpoints")
            time.sleep(0.2)

    def _listed(self, network_id: str) -> bool:
        return any(n["Id"] == network_id for n in self.engine.api.networks(filters={"id": network_id}))

    def _disconnect_all(self, network_id: str) -> int:
        """Disconnect by force every endpoint the engine lists on the network; how many it listed."""
        from docker.errors import APIError, NotFound

        api = self.engine.api
        try:
            endpoints = api.inspect_network(network_id).get("Containers") or {}
        except NotFound:
            return 0
        except APIError as exc:  # 500 "network ... not found": a swarm node's copy, gone meanwhile
            if "not found" in engine_error(exc):
                return 0
            raise
        for endpoint in endpoints:
            try:
                api.disconnect_container_from_network(endpoint, network_id, force=True)
            except (APIError, NotFound):
                pass  # gone meanwhile, or still being released: the next attempt tells
        return len(endpoints)

    # -- the lone replicas' network, one per installation ----------------------------------------

    @property
    def solo_network_name(self) -> str:
        installation = self.engine.installation
        return f"{SOLO_PREFIX}-{installation[:8]}" if installation else SOLO_PREFIX

    def solo_network(self) -> tuple[str, str]:
        """(id, gateway address) of the installation's network for lone replicas, created on
        first need. Creation is serialized by a lock in the home: the engine does not refuse a
        second network of the same name made at the same moment. Should duplicates exist (homes
        without a lock file), the oldest is the one, and the others are removed when empty."""
        with self.engine.home_lock("solo-network"):
            networks = self.solo_networks()
            if not networks:
                self.create(NetworkSpec(self.solo_network_name, self.engine.installation_labels(SOLO_ROLE),
                                        SOLO_NETWORK_ADDRESSES), options=SOLO_OPTIONS)
                networks = self.solo_networks()
        if not networks:
            raise EnvironmentNotReady(f"Docker did not keep the network {self.solo_network_name}: try again.")
        keep, *duplicates = networks
        for duplicate in duplicates:
            with contextlib.suppress(Exception):
                self.engine.api.remove_network(duplicate["Id"])
        config = keep["IPAM"]["Config"][0]
        gateway = config.get("Gateway") or str(ipaddress.ip_network(config["Subnet"], strict=False)[1])
        return keep["Id"], gateway.split("/")[0]

    def solo_networks(self) -> list[dict]:
        found = self.engine.api.networks(names=[self.solo_network_name],
                                         filters={"label": f"{LABEL_ROLE}={SOLO_ROLE}"})
        return sorted((n for n in found if n["Name"] == self.solo_network_name), key=lambda n: n["Created"])

"""A lone replica's network made ready before its job: the network holders of one installation.

A container's start on a user-defined bridge costs the engine its network set-up: a namespace,
a veth pair, and the embedded DNS resolver (on Docker 20.10 a re-executed dockerd and eleven
iptables runs inside the namespace). That was most of a BASIC job's start (0.44 s against 0.16 s
for a container joining a running container's network, measured here) and, for many BASIC jobs
at once, most of the engine's work (figure 11). So a lone replica joins a "holder": a container
asleep on the solo network with the lone replicas' hostname and extra hosts, whose network it
shares (network mode container:<holder>). The home's controller keeps one ready; when a job's
replica is removed its holder goes back to the pool for the next lone replica, so a run of BASIC
jobs sets up a network for the first few only.

One namespace serving one job after another leaks nothing from one to the next: a holder serves
one replica at a time (it goes back only once its replica is removed); a replica cannot change
the namespace (no capabilities, no new privileges) nor the holder's /etc/hosts and resolv.conf
that it shares (root's; replicas never run as root); and its processes, with their sockets, end
with its container (a PID namespace of its own).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aiptrain.backends.engine import Engine, engine_error
from aiptrain.labels import LABEL_INSTALLATION, LABEL_ROLE
from aiptrain.planning import LONE_HOSTNAME, ContainerSpec
from aiptrain.storage.endpoint import API_HOSTS

log = logging.getLogger(__name__)

HOLDER_ROLE = "network-holder"
HOLDER_MEMORY = 32 * 1024 * 1024  # `sleep` needs under one
# After a launch the next holder waits a moment, so its start does not compete with the
# trainer's for the cores.
HOLDER_AFTER_LAUNCH_SECONDS = 1.0
# Holders waiting in the pool: at most this many (each is a sleeping process and the engine's
# shim, a few MB); beyond the newest, one unused this long goes.
HOLDERS_KEPT = 8
HOLDER_IDLE_SECONDS = 60.0


def holders_used(containers: Iterable[dict]) -> set[str]:
    """The holders whose network these containers joined (network mode container:<ID>)."""
    modes = ((c.get("HostConfig") or {}).get("NetworkMode") or "" for c in containers)
    return {mode.removeprefix("container:") for mode in modes if mode.startswith("container:")}


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
    since: float  # time.monotonic() when it became ready


class Holders:
    """The pool of holders (HOLDER_ROLE), kept only by the process that launches the
    installation's jobs (`keep`, from the controller's warm-up)."""

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.monotonic):
        self.engine = engine
        self.clock = clock
        self._lock = threading.Lock()  # guards the fields below
        self._keeps = False
        self._ready: list[ReadyHolder] = []  # the pool, the newest last
        self._recipe: HolderRecipe | None = None  # from the last lone launch
        self._in_hand: set[str] = set()  # taken by a launch, not yet joined by its replica
        self._lent: dict[str, str] = {}  # holder ID -> its gateway, from its take until its replica goes
        self._missed = 0  # launches that found the pool empty since the last make: holders wanted
        self._making = False
        self._timer: tuple[threading.Timer, float] | None = None  # the next make, and when it is due
        self._trim_timer: threading.Timer | None = None

    def keep(self) -> None:
        self._keeps = True

    def take(self, gateway: str) -> str | None:
        """A ready holder's ID, lent to one replica, if its network is the one wanted (the solo
        network made again since is not: those holders go)."""
        with self._lock:
            stale = [h.container_id for h in self._ready if h.gateway != gateway]
            self._ready = [h for h in self._ready if h.gateway == gateway]
            holder = self._ready.pop() if self._ready else None
            if holder is None:
                self._missed += 1
            else:
                self._in_hand.add(holder.container_id)
                self._lent[holder.container_id] = gateway
        self.engine.remove_containers(stale)
        return holder.container_id if holder else None

    def let_go_of(self, holder: str | None) -> None:
        """The launch is done with the holder it took: its replica uses it, or it is gone."""
        if holder:
            with self._lock:
                self._in_hand.discard(holder)

    def discard(self, holder: str) -> None:
        """A holder whose replica could not start in it: it goes."""
        with self._lock:
            self._lent.pop(holder, None)
        self.engine.remove_containers([holder])

    def start_in(self, spec: ContainerSpec, env: dict[str, str], holder: str,
                 serving: Callable[[], object] | None) -> bool:
        """Start the replica in the holder's network (its hostname is LONE_HOSTNAME), after
        `serving()` returns when given. False when the holder cannot serve (an engine restart
        stopped it): what was made goes, and the replica makes its own network."""
        from docker.errors import APIError

        try:
            container_id = self.engine.create(spec, env, f"container:{holder}")
            if serving:
                serving()
            self.engine.api.start(container_id)
            return True
        except APIError as exc:
            log.info("A lone replica could not join its ready network (%s): it makes its own.", engine_error(exc))
        self.engine.remove_containers([spec.name])
        self.discard(holder)
        return False

    def give_back(self, used: set[str]) -> None:
        """The holders of a job whose replicas are removed: back to the pool, but those beyond
        HOLDERS_KEPT and those lent by an earlier controller, which go (in a thread of their own,
        as the job's end need not wait for that)."""
        now, surplus = self.clock(), []
        with self._lock:
            for holder in used:
                gateway = self._lent.pop(holder, None)
                if gateway is not None and self._keeps and len(self._ready) < HOLDERS_KEPT:
                    self._ready.append(ReadyHolder(holder, gateway, now))
                else:
                    surplus.append(holder)
            trim = self._trim_later()
        if trim is not None:
            trim.start()
        if surplus:
            threading.Thread(target=self._remove_then_keep_ready, args=(surplus,), daemon=True).start()

    def _remove_then_keep_ready(self, holders: list[str]) -> None:
        self.engine.remove_containers(holders)
        self.keep_ready(None, 0.0)

    def _trim(self) -> None:
        """Beyond the newest, the holders unused for HOLDER_IDLE_SECONDS go: a burst of jobs
        leaves a pool that a quiet spell does not need."""
        with self._lock:
            self._trim_timer = None
            cutoff = self.clock() - HOLDER_IDLE_SECONDS
            idle = [h for h in self._ready[:-1] if h.since <= cutoff]
            self._ready = [h for h in self._ready if h not in idle]
            trim = self._trim_later()
        if trim is not None:
            trim.start()
        self.engine.remove_containers([h.container_id for h in idle])

    def _trim_later(self) -> threading.Timer | None:
        """Under the lock: the next trim, when the pool holds more than one and none is due (the
        caller starts it once the lock is let go)."""
        if len(self._ready) <= 1 or self._trim_timer is not None:
            return None
        trim = self._trim_timer = threading.Timer(HOLDER_IDLE_SECONDS, self._trim)
        trim.daemon = True
        return trim

    def keep_ready(self, recipe: HolderRecipe | None, delay: float) -> None:
        """Make holders in the background, after `delay`: one when the pool is empty, and one for
        each launch that found it empty (a burst of BASIC jobs grows the pool to what it takes),
        unless they are being made or due sooner."""
        with self._lock:
            self._recipe = recipe or self._recipe
            if not self._keeps or self._recipe is None or self._making or not self._wanted():
                return
            due = time.monotonic() + delay
            if self._timer is not None:
                pending, pending_due = self._timer
                if pending_due <= due:
                    return
                pending.cancel()
            timer = threading.Timer(delay, self._make)
            timer.daemon = True
            self._timer = (timer, due)
        timer.start()

    def _wanted(self) -> bool:
        return len(self._ready) < HOLDERS_KEPT and (not self._ready or self._missed > 0)

    def _make(self) -> None:
        with self._lock:
            self._timer = None  # whatever happens now, the next keep_ready may schedule again
            if self._making or not self._wanted():  # a timer cancelled too late, or nothing wanted now
                return
            self._making = True
        while True:
            with self._lock:
                recipe = self._recipe
                self._missed = max(0, self._missed - 1)
            holder = None
            try:
                if recipe is not None:
                    holder = ReadyHolder(self._start(recipe), recipe.gateway, self.clock())
            except Exception as exc:  # noqa: BLE001 - only a speed-up: a launch without one makes its own network
                log.info("Could not make a network ready for the next lone replica: %s", exc)
            with self._lock:
                keep = holder is not None and self._keeps and len(self._ready) < HOLDERS_KEPT
                if keep and holder is not None:
                    self._ready.append(holder)
                more = keep and self._wanted()
                self._making = more
            if holder is not None and not keep:  # the controller let go of the engine meanwhile
                self.engine.remove_containers([holder.container_id])
            if not more:
                return

    def _start(self, recipe: HolderRecipe) -> str:
        """A holder: asleep on the solo network with the lone replicas' hostname and their extra
        hosts (Google's API hosts at the storage endpoint), unprivileged like a replica."""
        api, engine = self.engine.api, self.engine
        host_config = api.create_host_config(
            network_mode=recipe.network, extra_hosts=dict.fromkeys(API_HOSTS, recipe.gateway), read_only=True,
            cap_drop=["ALL"], security_opt=["no-new-privileges"], pids_limit=8, mem_limit=HOLDER_MEMORY,
        )
        owner = {LABEL_INSTALLATION: engine.installation} if engine.installation else {}
        container = api.create_container(  # the base image first: it is aiptrain's, not a job's
            engine.present_image(tuple(reversed(recipe.images))), command=["sleep", "infinity"], user=recipe.user,
            hostname=LONE_HOSTNAME, labels=engine.with_home({**owner, LABEL_ROLE: HOLDER_ROLE}),
            host_config=host_config,
        )
        api.start(container["Id"])
        return container["Id"]

    def remove_idle(self) -> None:
        """This home's holders that no replica uses and that are not in the pool: what a
        controller that died, a launch that failed, or a replica removed by hand left."""
        if not self.engine.installation:
            return
        containers = self.engine.api.containers(all=True, filters={"label": self.engine.owner()})
        used = holders_used(containers)
        with self._lock:
            if self._making:  # one being made is not ready yet, nor used: the next sweep looks
                return
            used |= {*self._in_hand, *(h.container_id for h in self._ready)}
            idle = [c["Id"] for c in containers
                    if (c.get("Labels") or {}).get(LABEL_ROLE) == HOLDER_ROLE and c["Id"] not in used]
            for holder in idle:
                self._lent.pop(holder, None)
        self.engine.remove_containers(idle)

    def stop_keeping(self) -> None:
        """The controller lets go of the engine: no more holders, and the pool goes."""
        with self._lock:
            self._keeps = False
            ready, self._ready = self._ready, []
            if self._trim_timer is not None:
                self._trim_timer.cancel()
                self._trim_timer = None
        self.engine.remove_containers([h.container_id for h in ready])

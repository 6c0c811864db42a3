"""What no job removes: what homes deleted from this host left on its engine, the networks the
engine kept after this home's jobs ended, and, when this home itself is deleted, what its jobs
shared here."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection

from aiptrain.backends.engine import Engine, engine_error, engine_is_local
from aiptrain.backends.holders import HOLDER_ROLE, Holders, holders_used
from aiptrain.backends.networks import SOLO_ROLE, Networks
from aiptrain.labels import LABEL_HOME, LABEL_JOB, LABEL_ROLE
from aiptrain.storage.endpoint import ROLE

log = logging.getLogger(__name__)


class Sweep:
    def __init__(self, engine: Engine, networks: Networks, holders: Holders):
        self.engine = engine
        self.networks = networks
        self.holders = holders

    def remove_abandoned(self, active_jobs: Callable[[], Collection[str]] | None = None) -> None:
        """What homes deleted from this host left on its engine when no controller of theirs ran
        to remove it (their storage endpoint, their replicas, which exit on their own, and the
        networks: each holds a subnet of AIPTRAIN_SUBNET_POOL for good, and a machine that makes
        a fresh home per CI run used to exhaust the pool, 128 of them). Only on an engine of
        this host (a home on another machine is not this one's to judge), and only what no
        trainer uses: a replica still running stays, and so does its network. Given this home's
        `active_jobs`, also what this home's own ended jobs left (`_remove_kept_networks`)."""
        from docker.errors import APIError, NotFound

        self.holders.remove_idle()
        if active_jobs is not None:
            self._remove_kept_networks(active_jobs)
        if not engine_is_local():
            return
        api = self.engine.api
        containers = api.containers(all=True, filters={"label": LABEL_HOME})
        networks = api.networks(filters={"label": LABEL_HOME})
        gone = {home for home in ((item.get("Labels") or {}).get(LABEL_HOME, "") for item in [*containers, *networks])
                if self.engine.deleted(home)}
        in_use = holders_used(containers)
        for item in [*containers, *networks]:  # containers first: a network with one on it stays
            labels = item.get("Labels") or {}
            if labels.get(LABEL_HOME) not in gone:
                continue
            role = labels.get(LABEL_ROLE)
            with contextlib.suppress(NotFound, APIError):  # in use, or gone meanwhile
                if "Driver" in item:  # a network
                    api.remove_network(item["Id"])
                elif role == ROLE or (role == HOLDER_ROLE and item["Id"] not in in_use) or item.get("State") != "running":
                    api.remove_container(item["Id"], force=True)  # the endpoint, an idle holder, or done
        if gone:
            log.info("Removed what %d deleted home(s) left on the engine: %s", len(gone), ", ".join(sorted(gone)))

    def _remove_kept_networks(self, active_jobs: Callable[[], Collection[str]]) -> None:
        """Networks of this home's jobs that have ended: the engine kept them at the teardown (a
        stale endpoint, which restarting dockerd clears), each holding a subnet of the pool. The
        jobs are asked for after the networks are listed: a network listed belongs to a job
        recorded before it, so a job launching meanwhile is among the active ones."""
        from docker.errors import APIError

        if not self.engine.home:
            return
        api = self.engine.api
        networks = api.networks(filters={"label": [f"{LABEL_HOME}={self.engine.home}", LABEL_JOB,
                                                   *self.engine.owner()]})
        if not networks:
            return
        active = set(active_jobs())
        for network in networks:
            job_id = (network.get("Labels") or {}).get(LABEL_JOB, "")
            if job_id in active:
                continue
            try:
                api.remove_network(network["Id"])
            except APIError as exc:  # gone meanwhile (NotFound), or kept still: the next sweep tries again
                log.info("The network %s of ended job %s stays for now: %s", network["Name"], job_id, engine_error(exc))
                continue
            log.info("Removed the network %s that the engine had kept after job %s ended.", network["Name"], job_id)

    def remove_home(self) -> None:
        """Remove what the installation shares on this engine (the storage endpoint, the holders,
        the lone replicas' network): its home is gone, so nothing will use them again."""
        if not self.engine.installation:
            return
        self.holders.stop_keeping()
        api, owner = self.engine.api, self.engine.owner()
        self.engine.remove_containers(c["Id"] for c in api.containers(all=True, filters={"label": [*owner, LABEL_ROLE]}))
        for network in api.networks(filters={"label": [*owner, f"{LABEL_ROLE}={SOLO_ROLE}"]}):
            self.networks.remove(network["Id"])

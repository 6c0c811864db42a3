"""What one installation's jobs share on one Docker engine (aiptrain.backends.Installation): the
storage endpoint, the lone replicas' network and its holders, and the sweep. The home's
controller owns it; the Docker backend's launches use the same parts."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from aiptrain.backends.endpoint import DockerEndpoint
from aiptrain.backends.engine import Engine, engine_error
from aiptrain.backends.holders import Holders
from aiptrain.backends.networks import Networks
from aiptrain.backends.sweep import Sweep
from aiptrain.storage.endpoint import StorageEndpoint

log = logging.getLogger(__name__)


class DockerInstallation:
    def __init__(self, engine: Engine, networks: Networks, holders: Holders, endpoint: DockerEndpoint,
                 sweep: Sweep):
        self.engine = engine
        self.networks = networks
        self.holders = holders
        self.endpoint = endpoint
        self.sweep = sweep

    def warm_up(self, launches: bool = False) -> None:
        """Connect ahead of need; a failure shows up on first real use. The process that
        launches keeps a lone replica's network ready from now on (networks.HOLDER_ROLE)."""
        if launches:
            self.holders.keep()
        self.engine.warm_up()

    def ensure_storage_endpoint(self, endpoint: StorageEndpoint) -> str:
        return self.endpoint.ensure(endpoint)

    def release_shared(self, still_needed: Callable[[], bool]) -> None:
        """What the installation's jobs share never outlives them: the storage endpoint and the
        lone replicas' network (a /22 of the subnet pool, held for good by every home kept on
        disk otherwise) are removed when the last active job ends; the next launch makes them
        again (the endpoint about half a second, the network 0.07 s). Under the locks a launch
        makes them with, so a job recorded before its launch keeps them."""
        if not self.engine.installation or not self.engine.home:
            return
        from docker.errors import APIError

        self.holders.stop_keeping()
        with self.engine.home_lock("solo-network"), self.engine.home_lock("storage-endpoint"):
            if still_needed():
                return
            self.endpoint.remove()
            self.holders.remove_idle()
            for network in self.networks.solo_networks():
                try:
                    self.engine.api.remove_network(network["Id"])
                except APIError as exc:  # a holder still being made, a container still leaving: the next release
                    log.info("Kept the lone replicas' network for now: %s", engine_error(exc))

    def remove_installation(self) -> None:
        """Remove what the installation shares (the storage endpoint, the lone replicas' network);
        the next launch makes them again. For a deleted home, tests and uninstalling."""
        self.sweep.remove_home()

    def remove_abandoned(self, active_jobs: Callable[[], Collection[str]] | None = None) -> None:
        self.sweep.remove_abandoned(active_jobs)

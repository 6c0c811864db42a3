"""The installation's storage endpoint as a container on one engine (the server itself is
aiptrain.storage.endpoint's).

gs:// kept on this machine reaches replicas through it: a container on the engine's default
bridge, started on demand, whose port is published on the lone replicas' network gateway address
only; every replica resolves Google's API host names to that address (extra hosts), which any
bridge network's replicas reach through the host, and nothing else can.
"""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from aiptrain.backends.engine import DEFAULT_NETWORK, TMPFS_OPTIONS, Engine, NoEndpointImage, engine_error
from aiptrain.backends.networks import Networks
from aiptrain.errors import AiptrainError, EnvironmentNotReady
from aiptrain.labels import LABEL_CODE, LABEL_ROLE
from aiptrain.storage.endpoint import ENDPOINT_PORT, REPLICA_PORT, ROLE, StorageEndpoint

log = logging.getLogger(__name__)
ENDPOINT_READY_SECONDS = 20


def endpoint_current(info: dict, code: str, gateway: str) -> bool:
    """Whether the endpoint's container runs (or is being brought back) with this aiptrain's
    server code, published on the gateway."""
    bindings = ((info.get("HostConfig") or {}).get("PortBindings") or {}).get(f"{ENDPOINT_PORT}/tcp") or []
    alive = info["State"].get("Running") or info["State"].get("Restarting")  # the engine brings it back
    return bool(alive and info["Config"]["Labels"].get(LABEL_CODE) == code
                and any(b.get("HostIp") == gateway for b in bindings))


class DockerEndpoint:
    """The storage endpoint of one installation on one engine, published on its solo network's gateway."""

    def __init__(self, engine: Engine, networks: Networks):
        self.engine = engine
        self.networks = networks

    def image_present(self, endpoint: StorageEndpoint) -> bool:
        """Whether an image here can run the storage endpoint. Without one the job runs without
        it (its gs:// fails as offline), said in the log."""
        try:
            self.engine.present_image(endpoint.images)
            return True
        except NoEndpointImage as exc:
            log.warning("%s", exc)
            return False

    def ensure(self, endpoint: StorageEndpoint) -> str:
        """The address replicas reach the installation's storage endpoint at (port 443): the lone
        replicas' network gateway, where its port is published. Started if absent, replaced if it
        died, runs older code, or publishes elsewhere; one per installation (by name)."""
        from docker.errors import APIError, NotFound

        api = self.engine.api
        # A new home's TLS files (cryptography's import is most of their time) are made while the
        # engine makes the network.
        with ThreadPoolExecutor(max_workers=1) as files:
            made = files.submit(endpoint.prepare_files)
            _, gateway = self.networks.solo_network()
            made.result()
        with self.engine.home_lock("storage-endpoint"):  # concurrent launches: one starts it, the others find it
            for _ in range(3):
                try:
                    info = api.inspect_container(endpoint.name)
                except NotFound:
                    info = None
                if info and endpoint_current(info, endpoint.labels[LABEL_CODE], gateway):
                    return gateway
                if info:
                    with contextlib.suppress(NotFound):
                        api.remove_container(info["Id"], force=True)
                try:
                    self._start(endpoint, gateway)
                except APIError as exc:
                    if exc.status_code == 409:  # another home's process with no lock file: look again
                        time.sleep(0.2)
                        continue
                    raise AiptrainError(f"Could not start the storage endpoint for gs://: {engine_error(exc)}") from None
                self._wait_listening(endpoint.name)
                return gateway
        raise EnvironmentNotReady(f"The storage endpoint {endpoint.name} keeps changing: try again.")

    def remove(self) -> None:
        """Remove the installation's endpoint container, if any."""
        filters = {"label": [*self.engine.owner(), f"{LABEL_ROLE}={ROLE}"]}
        self.engine.remove_containers(c["Id"] for c in self.engine.api.containers(all=True, filters=filters))

    def _start(self, endpoint: StorageEndpoint, gateway: str) -> None:
        """The endpoint container: unprivileged like a replica (read-only root, no capabilities),
        the replicas' user, only the gcs tree writable; restarted by the engine if it dies."""
        from docker.types import Mount

        api = self.engine.api
        image = self.engine.present_image(endpoint.images)
        host_config = api.create_host_config(
            mounts=[Mount(target, source, type="bind", read_only=ro) for source, target, ro in endpoint.mounts()],
            port_bindings={ENDPOINT_PORT: (gateway, REPLICA_PORT)},
            network_mode=DEFAULT_NETWORK, init=True, read_only=True, tmpfs={"/tmp": TMPFS_OPTIONS},
            cap_drop=["ALL"], security_opt=["no-new-privileges"], restart_policy={"Name": "unless-stopped"},
            pids_limit=512,
        )
        labels = self.engine.with_home(endpoint.labels)
        container = api.create_container(
            image, command=endpoint.command, user=endpoint.user, labels=labels, name=endpoint.name,
            working_dir="/tmp", environment={"PYTHONDONTWRITEBYTECODE": "1"}, ports=[ENDPOINT_PORT],
            host_config=host_config,
        )
        api.start(container["Id"])

    def _wait_listening(self, name: str) -> None:
        """Until the endpoint says it serves (its first log line), so the replicas' first request
        finds it; a start that fails is reported with its output."""
        api = self.engine.api
        deadline = time.monotonic() + ENDPOINT_READY_SECONDS
        while time.monotonic() < deadline:
            output = api.logs(name).decode(errors="replace")
            if "serving" in output:
                return
            state = api.inspect_container(name)["State"]
            if not state.get("Running") and state.get("Status") == "exited":
                raise AiptrainError(f"The storage endpoint for gs:// did not start: {output.strip()[-300:]}")
            time.sleep(0.02)  # replicas wait for it: each look sooner is a look less of their start
        raise AiptrainError(f"The storage endpoint for gs:// did not start within {ENDPOINT_READY_SECONDS}s.")

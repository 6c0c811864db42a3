"""The storage endpoints on a swarm (one per job that reaches gs://, on the job's own network:
aiptrain.backends.swarm says why) and what one installation's jobs share there
(aiptrain.backends.Installation): on this manager's own engine, what the docker backend's
installation shares, and the sweep, which also takes what earlier releases shared on the swarm
(one endpoint on one overlay network per installation)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection

from aiptrain.backends.engine import Engine, NoEndpointImage, engine_is_local
from aiptrain.backends.networks import NETWORK_PATIENCE_SECONDS, Networks
from aiptrain.backends.swarm_specs import endpoint_service_spec, latest_task
from aiptrain.backends.sweep import Sweep
from aiptrain.errors import AiptrainError
from aiptrain.labels import LABEL_HOME, LABEL_ROLE
from aiptrain.storage.endpoint import ROLE, StorageEndpoint

log = logging.getLogger(__name__)
STORAGE_ROLE = "storage-network"  # the installation's overlay network its storage endpoint serves on
STORAGE_PREFIX = "aiptrain-gcs"
ENDPOINT_READY_SECONDS = 60  # a swarm schedules, then starts, the endpoint's task


class SwarmStorage:
    """The storage endpoints on the swarm `engine` manages: one per job that reaches gs://, a
    service of one task on this manager (where the gcs tree is), on that job's own network
    alone, so no network joins the replicas of two jobs (aiptrain.backends.swarm says why)."""

    def __init__(self, engine: Engine, networks: Networks):
        self.engine = engine
        self.networks = networks  # overlay networks

    @property
    def network_name(self) -> str:
        """The installation-wide storage network of earlier releases (swept, never made now)."""
        installation = self.engine.installation
        return f"{STORAGE_PREFIX}-{installation[:8]}" if installation else STORAGE_PREFIX

    def start_for_job(self, endpoint: StorageEndpoint, network: str, job_labels: dict[str, str]) -> str | None:
        """The job's own endpoint on its network `network` (name), once it serves: its service ID.
        With no image to run it, the job runs without (its gs:// fails as offline), said in the log."""
        api, engine = self.engine.api, self.engine
        endpoint.prepare_files()
        try:
            image = engine.present_image(endpoint.images)
        except NoEndpointImage as exc:
            log.warning("%s", exc)
            return None
        labels = engine.with_home({**job_labels, **endpoint.labels, **engine.installation_labels(ROLE)})
        service = api.create_service(**endpoint_service_spec(endpoint, image, network, api.info()["Swarm"]["NodeID"],
                                                             labels, name=f"{network}-gcs"))
        self._wait_serving(service["ID"])
        return service["ID"]

    def _networks(self) -> list[dict]:
        found = self.engine.api.networks(names=[self.network_name], filters={"label": f"{LABEL_ROLE}={STORAGE_ROLE}"})
        return sorted((n for n in found if n["Name"] == self.network_name), key=lambda n: n["Created"])

    def _services(self) -> list[dict]:
        return self.engine.api.services(filters={"label": [*self.engine.owner(), f"{LABEL_ROLE}={ROLE}"]})

    def _wait_serving(self, service_id: str) -> None:
        """Until the endpoint's task runs and says it serves. A task that fails meanwhile is
        reported with its error and output: the swarm makes its replacement at once (to start
        after the restart delay), so the failure is seen in the service's tasks, not its latest."""
        api = self.engine.api
        earlier = {t["ID"] for t in api.tasks(filters={"service": service_id})}
        deadline = time.monotonic() + ENDPOINT_READY_SECONDS
        status: dict = {}
        while time.monotonic() < deadline:
            tasks = api.tasks(filters={"service": service_id})
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
        output = self.engine.api.service_logs(service_id, stdout=True, stderr=True)
        return (output if isinstance(output, bytes) else b"".join(output)).decode(errors="replace")

    def remove(self) -> None:
        from docker.errors import NotFound

        for service in self._services():
            with contextlib.suppress(NotFound):
                self.engine.api.remove_service(service["ID"])
            self._wait_containers_gone(service["ID"])  # a task still starting would bring the network back here
        for network in self._networks():
            self.networks.remove(network["Id"])
            self._wait_gone(network["Id"])

    def _wait_containers_gone(self, service_id: str) -> None:
        """Until this node has removed the containers of a removed service's tasks."""
        deadline = time.monotonic() + NETWORK_PATIENCE_SECONDS
        while time.monotonic() < deadline:
            if not self.engine.api.containers(all=True, filters={"label": f"com.docker.swarm.service.id={service_id}"}):
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
                self.engine.api.inspect_network(network_id, scope="swarm")
            except NotFound:
                if not any(n["Id"] == network_id for n in self._networks()):
                    return
            time.sleep(0.2)
        raise AiptrainError(f"The swarm keeps the removed network {network_id[:12]}: see `docker network ls`.")

    def remove_abandoned(self) -> None:
        """The storage endpoints of homes deleted from this host, and their storage networks (the
        swarm would restart an endpoint's task for good, and it holds its network)."""
        from docker.errors import APIError, NotFound

        api = self.engine.api
        try:  # not a manager (left the swarm meanwhile, say): no services to look at
            endpoints = api.services(filters={"label": [LABEL_HOME, f"{LABEL_ROLE}={ROLE}"]}) \
                if engine_is_local() else []
        except APIError:
            endpoints = []
        for service in endpoints:
            labels = service["Spec"].get("Labels") or {}
            if not self.engine.deleted(labels.get(LABEL_HOME, "")):
                continue
            with contextlib.suppress(NotFound, APIError):  # gone meanwhile
                api.remove_service(service["ID"])
            self._wait_containers_gone(service["ID"])
            for network in api.networks(filters={"label": [f"{LABEL_HOME}={labels[LABEL_HOME]}",
                                                           f"{LABEL_ROLE}={STORAGE_ROLE}"]}):
                with contextlib.suppress(NotFound, APIError, AiptrainError):  # still held: the next sweep's
                    self.networks.remove(network["Id"])


class SwarmInstallation:
    def __init__(self, engine: Engine, storage: SwarmStorage, sweep: Sweep):
        self.engine = engine
        self.storage = storage
        self.sweep = sweep  # of this manager's own engine, as the docker backend's

    def warm_up(self, launches: bool = False) -> None:
        """Connect ahead of need (no network holders on a swarm: `launches` changes nothing)."""
        self.engine.warm_up()

    def ensure_storage_endpoint(self, endpoint: StorageEndpoint) -> str:
        """Nothing ahead of a launch: on a swarm each job's launch starts its own endpoint, on its network."""
        return ""

    def release_shared(self, still_needed: Callable[[], bool]) -> None:
        """What an earlier release shared between the installation's jobs (one storage endpoint
        and its network) goes when the last active job ends; each job's own endpoint goes with it."""
        if not self.engine.installation or not self.engine.home:
            return
        with self.engine.home_lock("storage-endpoint"):
            if still_needed():
                return
            self.storage.remove()

    def remove_installation(self) -> None:
        """What the installation shares on the swarm (storage endpoint and network), then on this engine."""
        if self.engine.installation:
            self.storage.remove()
        self.sweep.remove_home()

    def remove_abandoned(self, active_jobs: Callable[[], Collection[str]] | None = None) -> None:
        """First what deleted homes left on the swarm, then what the docker backend sweeps."""
        self.storage.remove_abandoned()
        self.sweep.remove_abandoned(active_jobs)

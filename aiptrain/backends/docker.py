"""The Docker backend: a job's replicas as containers on one engine.

A job of two or more replicas gets a bridge network of its own; lone replicas share the
installation's network on which containers cannot reach each other, each started in a network
made ready before it came (aiptrain.backends.networks). gs:// kept on this machine reaches
replicas through the installation's storage endpoint (aiptrain.backends.endpoint). Every
replica runs unprivileged (aiptrain.backends.engine says how).

`DockerBackend` holds its parts rather than being them: the engine handle (`engine`), the job
networks and holders (`networks`, `holders`), the storage endpoint's container (`endpoint`) and
what the installation's jobs share, with the sweep (`installation`, which the controller owns).
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime

from aiptrain.backends import ImageInfo, LogChunk, ReplicaObservation, ReplicaStatus
from aiptrain.backends.endpoint import DockerEndpoint
from aiptrain.backends.engine import (
    DEFAULT_NETWORK,
    Engine,
    EngineApi,
    each,
    host_listens,
    labelled_observation,
    removed_on_failure,
)
from aiptrain.backends.engine_logs import log_frames, read_log_lines
from aiptrain.backends.holders import HOLDER_AFTER_LAUNCH_SECONDS, HolderRecipe, Holders, holders_used
from aiptrain.backends.installation import DockerInstallation
from aiptrain.backends.networks import Networks
from aiptrain.backends.sweep import Sweep
from aiptrain.errors import EnvironmentLacks
from aiptrain.logs import parse_engine_time
from aiptrain.planning import ContainerSpec, LaunchPlan
from aiptrain.settings import DEFAULT_SUBNET_POOL, Settings
from aiptrain.storage.endpoint import API_HOSTS, AWAIT_ENDPOINT, REPLICA_PORT

_EXIT_STATUS = re.compile(r"Exited \((-?\d+)\)")
# The engine's container states as replica states; any other ("exited", "dead") is EXITED.
_STATES = {"created": ReplicaStatus.CREATED, "running": ReplicaStatus.RUNNING,
           "restarting": ReplicaStatus.RUNNING, "paused": ReplicaStatus.RUNNING}
LOGS_PATH = "/containers/{0}/logs"  # the engine's log endpoint of one replica


class DockerBackend:
    name = "docker"
    # Bind mounts of this host's directories reach every replica: packages can be installed
    # once here (aiptrain.installs) and mounted into all of them.
    host_dirs_reach_replicas = True

    def __init__(self, installation_id: str | None = None, client: EngineApi = None,
                 subnet_pool: str = DEFAULT_SUBNET_POOL, home: str | None = None):
        self.engine = Engine(installation_id, client, home)
        self.networks = Networks(self.engine, subnet_pool, {"driver": "bridge"})
        self.holders = Holders(self.engine)  # kept only by the process that launches (warm_up)
        self.endpoint = DockerEndpoint(self.engine, self.networks)
        self.installation = DockerInstallation(self.engine, self.networks, self.holders, self.endpoint,
                                               Sweep(self.engine, self.networks, self.holders))
        self.networks.free_pool = self.installation.remove_abandoned

    @classmethod
    def from_settings(cls, settings: Settings) -> DockerBackend:
        """The backend of one aiptrain home: its installation and its subnet pool."""
        return cls(settings.installation_id, subnet_pool=settings.subnet_pool, home=str(settings.home))

    def host_address(self) -> str | None:
        """This host's address as replicas reach it (e.g. for an emulator running here)."""
        return self.engine.host_address()

    # -- readiness -----------------------------------------------------------------------

    def check_ready(self, plan: LaunchPlan, present: Collection[str] = ()) -> None:
        self.networks.check_pool()
        self.engine.check_images(plan, present=present)
        if any(c.gpus for c in plan.containers) and not self.engine.has_gpu_runtime():
            raise EnvironmentLacks(
                "This job asks for GPUs but the Docker engine has no GPU runtime: install the "
                "NVIDIA Container Toolkit, or submit without accelerators."
            )

    def inspect_image(self, image: str) -> ImageInfo | None:
        return self.engine.inspect_image(image)

    def run_to_completion(self, spec: ContainerSpec) -> tuple[int, str]:
        """Run a one-off container with no network (an install step) and remove it; (status, output)."""
        return self.engine.run_to_completion(spec)

    # -- launch --------------------------------------------------------------------------

    def launch(self, plan: LaunchPlan) -> None:
        """The job's network and replicas. Replicas are made and started while the storage
        endpoint comes up (in a new home, or after a quiet spell, it takes the longest: about
        half a second); their bootstrap waits for it to listen before the trainer runs, since a
        trainer's first request may come at once and not every client retries a refused
        connection. A replica without the bootstrap (a custom container's own command) is
        started once the endpoint serves."""
        with removed_on_failure(plan, self.remove), ThreadPoolExecutor(max_workers=1) as endpoint_starter:
            # A job without a network of its own runs on the solo network, whose gateway is where
            # the storage endpoint listens.
            solo, gateway = self.networks.solo_network() if not plan.network or plan.storage else ("", "")
            serving: Future[str] | None = None
            hosts = None
            if plan.storage and gateway and self.endpoint.image_present(plan.storage):
                serving = endpoint_starter.submit(self.endpoint.ensure, plan.storage)
                hosts = dict.fromkeys(API_HOSTS, gateway)
            if plan.network:
                self.networks.create(plan.network)
            network = plan.network.name if plan.network else solo
            lone_at_endpoint = not plan.network and hosts is not None  # what holders are made for
            holder = self.holders.take(gateway) if lone_at_endpoint else None
            # Until the endpoint's port is published, a replica's connection there reaches the host.
            early = serving is not None and not serving.done() and not host_listens(gateway, REPLICA_PORT)

            def create_then_start(spec: ContainerSpec) -> None:
                env, start_after = plan.environment(spec), serving
                if early and serving and not serving.done() and spec.runs_bootstrap:  # it waits itself
                    env, start_after = {**env, AWAIT_ENDPOINT: f"{API_HOSTS[1]}:{REPLICA_PORT}"}, None
                if holder and self.holders.start_in(spec, env, holder, start_after.result if start_after else None):
                    return
                container_id = self.engine.create(spec, env, network, hosts, bool(plan.network))
                if start_after:
                    start_after.result()
                self.engine.api.start(container_id)

            try:
                each(create_then_start, plan.containers)
                if serving:
                    serving.result()  # an endpoint that never serves fails the launch
            except BaseException:
                if holder:
                    self.holders.discard(holder)
                raise
            finally:
                self.holders.let_go_of(holder)
        if lone_at_endpoint and plan.storage:
            self.holders.keep_ready(HolderRecipe(plan.storage.images, plan.storage.user, solo, gateway),
                                    HOLDER_AFTER_LAUNCH_SECONDS)

    # -- observation ---------------------------------------------------------------------

    def observe(self, job_id: str) -> list[ReplicaObservation]:
        observations = []
        for info in self.engine.job_containers(job_id):
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
            state = self.engine.api.inspect_container(info["Id"])["State"]
        except NotFound:
            return code, None
        finished_ns = parse_engine_time(state["FinishedAt"])
        return state["ExitCode"], datetime.fromtimestamp(finished_ns / 1e9).astimezone()

    # -- control -------------------------------------------------------------------------

    def restart(self, container_id: str) -> None:
        self.engine.api.start(container_id)

    def stop(self, container_ids: list[str], grace_seconds: int = 10) -> None:
        from docker.errors import NotFound

        def stop_one(container_id: str) -> None:
            try:
                self.engine.api.stop(container_id, timeout=grace_seconds)
            except NotFound:
                pass

        each(stop_one, container_ids)

    def remove(self, job_id: str, trial_id: str | None = None) -> None:
        containers = self.engine.leftover_containers(job_id, trial_id)
        self.engine.remove_replicas(containers, keep_networks={DEFAULT_NETWORK, self.networks.solo_network_name})
        holders = holders_used(containers)
        if holders:  # after their replicas, which used them
            self.holders.give_back(holders)
        self.networks.remove_job_networks(job_id, trial_id)

    def watch(self, stop: threading.Event, on_change: Callable[[str], None]) -> None:
        self.engine.watch(stop, on_change)

    # -- logs ----------------------------------------------------------------------------

    def follow_logs(self, container_id: str, since_ns: int | None = None) -> Iterator[list[LogChunk]]:
        """Every log line of the container from `since_ns` on, following until it stops, in
        batches: the lines that had arrived together."""
        frames = functools.partial(log_frames, self.engine.api, LOGS_PATH, container_id)
        yield from read_log_lines(frames, since_ns)

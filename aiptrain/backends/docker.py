"""The Docker backend: one engine, one user-defined bridge network per job.

Every replica runs unprivileged: the host user's uid (or nobody when aiptrain runs as
root), all capabilities dropped, no-new-privileges, a read-only root filesystem with
a tmpfs /tmp, the packages read-only, and only the job dir writable. The Docker
socket is never mounted. An init process (tini) is PID 1, so SIGTERM reaches the
trainer and a stop takes milliseconds instead of the whole grace period.
"""

from __future__ import annotations

import re
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Iterator

from aiptrain.backends import CREATED, EXITED, RUNNING, LogChunk, ReplicaObservation
from aiptrain.errors import AiptrainError, EnvironmentNotReady
from aiptrain.logs import parse_engine_time
from aiptrain.planning import (
    LABEL_INSTALLATION,
    LABEL_JOB,
    LABEL_TASK,
    LABEL_TASK_INDEX,
    LABEL_TASK_TYPE,
    LABEL_TRIAL,
    ContainerSpec,
    LaunchPlan,
)

TMPFS_OPTIONS = "rw,nosuid,nodev,exec,size=4g"
_EXIT_STATUS = re.compile(r"Exited \((-?\d+)\)")
_STATES = {"created": CREATED, "running": RUNNING, "restarting": RUNNING, "paused": RUNNING}


def connect(timeout: int = 120):
    """A low-level client for the engine DOCKER_HOST names (or the local socket)."""
    import docker
    from docker.errors import DockerException

    try:
        # DOCKER_HOST, DOCKER_TLS_VERIFY and DOCKER_CERT_PATH, as the docker CLI reads them.
        # version="auto" asks the engine for its API version: that request is the reachability check.
        return docker.APIClient(version="auto", timeout=timeout, max_pool_size=64, **docker.utils.kwargs_from_env())
    except DockerException as exc:
        raise EnvironmentNotReady(
            f"Cannot reach the Docker engine ({_first_line(exc)}): start Docker or set DOCKER_HOST."
        ) from None


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def host_gateway(api) -> str | None:
    """This host's address on Docker's default bridge (docker0), which every bridge network's
    containers can reach; None if the engine does not say."""
    import ipaddress

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


class DockerBackend:
    def __init__(self, installation: str | None = None, client=None):
        self._installation = installation
        self._client = client
        self._connecting = threading.Lock()

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

    def warm_up(self) -> None:
        """Connect ahead of need (from a background thread); a failure shows up on first real use."""
        try:
            self.api
        except Exception:  # noqa: BLE001 - reported by the call that needs the engine
            pass

    def check_ready(self, plan: LaunchPlan) -> None:
        from docker.errors import ImageNotFound

        for image in sorted({c.image for c in plan.containers}):
            try:
                self.api.inspect_image(image)
            except ImageNotFound:
                raise EnvironmentNotReady(
                    f"Image [{image}] is not on this Docker engine: build or load it first "
                    "(runtime images: `aiptrain runtimes build VERSION`)."
                ) from None
        if any(c.gpus for c in plan.containers):
            runtimes = self.api.info().get("Runtimes", {})
            if "nvidia" not in runtimes:
                raise EnvironmentNotReady(
                    "This job asks for GPUs but the Docker engine has no GPU runtime: install the "
                    "NVIDIA Container Toolkit, or submit without accelerators."
                )

    # -- launch --------------------------------------------------------------------------

    def launch(self, plan: LaunchPlan) -> None:
        try:
            self.api.create_network(
                plan.network.name, driver="bridge", labels=plan.network.labels, check_duplicate=True
            )
            with ThreadPoolExecutor(max_workers=min(32, len(plan.containers))) as pool:
                for future in [pool.submit(self._start, spec, plan.network.name) for spec in plan.containers]:
                    future.result()
        except BaseException as exc:
            self.remove(plan.job_id, plan.trial_id)  # a failed trial's launch leaves the other trials be
            if isinstance(exc, AiptrainError | KeyboardInterrupt):
                raise
            raise AiptrainError(f"Docker could not start the job's replicas: {_first_line(exc)}") from exc

    def _host_config(self, spec: ContainerSpec, network_mode: str) -> dict:
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
            device_requests=[DeviceRequest(count=spec.gpus, capabilities=[["gpu"]])] if spec.gpus else None,
        )

    def image_id(self, image: str) -> str:
        return self.api.inspect_image(image)["Id"]

    def run_to_completion(self, spec: ContainerSpec) -> tuple[int, str]:
        """Run a one-off container with no network (an install step) and remove it; (status, output)."""
        api = self.api
        container = api.create_container(
            spec.image, command=spec.command, entrypoint=spec.entrypoint, environment=spec.env, user=spec.user,
            working_dir=spec.working_dir, labels=spec.labels, host_config=self._host_config(spec, "none"),
        )
        try:
            api.start(container["Id"])
            status = api.wait(container["Id"])["StatusCode"]
            output = api.logs(container["Id"]).decode(errors="replace")
        finally:
            api.remove_container(container["Id"], force=True)
        return status, output

    def _start(self, spec: ContainerSpec, network: str) -> None:
        api = self.api
        host_config = self._host_config(spec, network)
        endpoint = api.create_endpoint_config(aliases=[spec.hostname])
        container = api.create_container(
            spec.image,
            command=spec.command,
            entrypoint=spec.entrypoint,
            environment=spec.env,
            hostname=spec.hostname,
            labels=spec.labels,
            name=spec.name,
            user=spec.user,
            working_dir=spec.working_dir,
            host_config=host_config,
            networking_config=api.create_networking_config({network: endpoint}),
        )
        api.start(container["Id"])

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
            status = _STATES.get(info["State"], EXITED)
            exit_code = finished = None
            if status == EXITED:
                exit_code, finished = self._exit_details(info)
            observations.append(
                ReplicaObservation(
                    task_name=labels[LABEL_TASK],
                    task_type=labels[LABEL_TASK_TYPE],
                    task_index=int(labels[LABEL_TASK_INDEX]),
                    status=status,
                    exit_code=exit_code,
                    finished_at=finished,
                    container_id=info["Id"],
                    trial_id=labels.get(LABEL_TRIAL, ""),
                )
            )
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

        def remove_one(container_id: str) -> None:
            try:
                self.api.remove_container(container_id, force=True)
            except NotFound:
                pass
            except APIError as exc:  # "removal already in progress" from a concurrent cleanup
                if "already in progress" not in str(exc):
                    raise

        self._each(remove_one, [c["Id"] for c in self._containers(job_id, trial_id)])
        for network in self.api.networks(filters={"label": self._job_labels(job_id, trial_id)}):
            try:
                self.api.remove_network(network["Id"])
            except NotFound:
                pass

    @staticmethod
    def _each(action, items: list[str]) -> None:
        if not items:
            return
        with ThreadPoolExecutor(max_workers=min(32, len(items))) as pool:
            list(pool.map(action, items))

    def wait_for_changes(self, job_id: str, stop: threading.Event, changed: threading.Event) -> None:
        """Set `changed` whenever a replica of the job starts or dies, until `stop` is set: the
        supervisor reacts at once instead of at its next poll."""
        from docker.errors import DockerException
        from requests.exceptions import RequestException

        filters = {"label": self._job_labels(job_id), "type": "container", "event": ["die", "start"]}
        while not stop.is_set():
            try:
                since = time.time()
                for _ in self.api.events(since=since, until=since + 30, filters=filters, decode=True):
                    changed.set()
            except (DockerException, RequestException, OSError):
                stop.wait(1)  # the engine is away; the supervisor's poll carries on meanwhile

    # -- logs ----------------------------------------------------------------------------

    def follow_logs(self, container_id: str, since_ns: int | None = None) -> Iterator[LogChunk]:
        """Every log line of the container from `since_ns` on, following until it stops.

        docker-py's logs() merges stdout and stderr; the severity of a line depends on
        which stream it came from, so the engine's multiplexed frames are read directly.
        """
        api = self.api
        params = {"follow": 1, "stdout": 1, "stderr": 1, "timestamps": 1}
        if since_ns:
            params["since"] = f"{since_ns // 1_000_000_000}.{since_ns % 1_000_000_000:09d}"
        response = api._get(api._url("/containers/{0}/logs", container_id), params=params, stream=True)
        api._raise_for_status(response)
        api._disable_socket_timeout(api._get_raw_response_socket(response))  # follow may wait long
        pending = {1: b"", 2: b""}
        try:
            for stream_id, data in _frames(response):
                pending[stream_id] += data
                *lines, pending[stream_id] = pending[stream_id].split(b"\n")
                for line in lines:
                    chunk = _chunk("stdout" if stream_id == 1 else "stderr", line, since_ns)
                    if chunk:
                        yield chunk
        finally:
            response.close()


def _frames(response) -> Iterator[tuple[int, bytes]]:
    """The engine's multiplexed stream: an 8-byte header (stream id, size), then the payload."""
    while True:
        header = response.raw.read(8)
        if len(header) < 8:
            return
        stream_id, length = struct.unpack(">BxxxL", header)
        data = response.raw.read(length) if length else b""
        if stream_id in (1, 2) and data:
            yield stream_id, data


def _chunk(stream: str, raw: bytes, since_ns: int | None) -> LogChunk | None:
    stamp, _, text = raw.decode(errors="replace").partition(" ")
    if since_ns and parse_engine_time(stamp) <= since_ns:
        return None  # already seen before a restart re-attached
    return LogChunk(time=stamp, stream=stream, text=text.rstrip("\r"))

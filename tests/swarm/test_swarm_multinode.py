"""Two replicas on two Swarm nodes talking to each other, on one machine.

`make test-multinode` runs this module between `scripts/multinode-swarm.sh up` and `down`: a
second dockerd in its own network namespace joins the host engine's swarm as a worker (labels
aiptrain-node=1 on the host, =2 on the second). `make test` deselects the `multinode` marker.

- The raw test needs no aiptrain backend: two Swarm services pinned one to each node run
  tests/trainers/node_talk with a hand-made TF_CONFIG on an attachable overlay network; the
  worker reaches the master by service name. It tests the harness itself.
- The aiptrain test submits a CUSTOM job (master + 1 worker) with `--backend swarm` and reads
  the result with `jobs stream-logs` and `jobs describe`, as a user would.

Facts measured here (Docker 20.10.24, kernel 6.18, 2 cores; also in docs/guide/swarm.md):
- `up` from scratch took 9 to 23 s (copying aiptrain/runtime:minimal, 191 MB, to node2
  included; the machine was busy with others' tests), 1.4 s when already up; `down` 4 to 16 s;
  the raw test 7 to 11 s.
- On an empty swarm the scheduler put two one-task services on different nodes (3 of 3 tries):
  the aiptrain test relies on that, as the swarm backend places replicas by resources only.
- The kernel has no IPVS, so a service's virtual IP does not work: services must use
  `--endpoint-mode dnsrr` (the name resolves to the task's own address).
- Linux drops VXLAN packets whose outer source differs from a static forwarding entry; the host
  must send to node2 from the address it advertises to the swarm (the script adds that route).
- No registry: node2's dockerd runs with DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1, otherwise
  every task waits out a DNS timeout trying to pull before using the local image.
- Docker 20.10 leaves a `replicated-job` task's container running when its service is removed
  (moby/moby#44312, fixed in Moby 24): these tests use `replicated` services with restart
  condition `none`, which behave as one-shot tasks and are cleaned up on removal.
"""

from __future__ import annotations

import json
import os
import threading
import uuid

import pytest
import yaml

from conftest import REPO, _unavailable, wait_for

pytestmark = pytest.mark.multinode

TRAINER = REPO / "tests" / "trainers" / "node_talk"
NODE2_SOCKET = os.environ.get("MULTINODE_NODE2_SOCKET", "unix:///run/aiptrain-node2.sock")
IMAGE = "aiptrain/runtime:minimal"
TEST_LABEL = "aiptrain.multinode-test"


@pytest.fixture(scope="module")
def two_nodes(docker_api) -> dict[str, str]:
    """{"1": host node's hostname, "2": node2's}: both Ready in the host engine's swarm."""
    swarm = docker_api.info()["Swarm"]
    if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
        _unavailable("the host engine is not a swarm manager: run `scripts/multinode-swarm.sh up` (as root)")
    nodes = {
        node["Spec"].get("Labels", {}).get("aiptrain-node"): node["Description"]["Hostname"]
        for node in docker_api.nodes()
        if node["Status"]["State"] == "ready"
    }
    if not {"1", "2"} <= set(nodes):
        _unavailable("no Ready nodes labelled aiptrain-node=1 and =2: run `scripts/multinode-swarm.sh up` (as root)")
    return nodes


@pytest.fixture(scope="module")
def node2_api(two_nodes):
    import docker

    return docker.APIClient(base_url=NODE2_SOCKET, version="auto")


def node_hostname(api, node_id: str) -> str:
    return api.inspect_node(node_id)["Description"]["Hostname"]


def service_logs(api, service_id: str) -> str:
    return b"".join(api.service_logs(service_id, stdout=True, stderr=True)).decode(errors="replace")


def containers_labelled(apis, label: str) -> list[str]:
    return [c["Names"][0] for api in apis for c in api.containers(all=True, filters={"label": label})]


# --- the harness itself: raw services, no aiptrain --------------------------------------------


def create_talk_service(api, name: str, network_id: str, task_type: str, node: str, cluster: dict, label: str) -> str:
    from docker.types import ContainerSpec, EndpointSpec, Placement, RestartPolicy, ServiceMode, TaskTemplate

    tf_config = {"cluster": cluster, "task": {"type": task_type, "index": 0}}
    container = ContainerSpec(
        IMAGE,
        command=["python3", "-c", (TRAINER / "task.py").read_text()],
        env={"TF_CONFIG": json.dumps(tf_config),
             "AIPTRAIN_NODE_HOSTNAME": "{{.Node.Hostname}}"},  # a Swarm template, filled in per task
        labels={TEST_LABEL: label},
    )
    template = TaskTemplate(
        container,
        restart_policy=RestartPolicy(condition="none"),
        placement=Placement(constraints=[f"node.labels.aiptrain-node=={node}"]),
        networks=[network_id],
    )
    return api.create_service(
        template, name=name, labels={TEST_LABEL: label},
        mode=ServiceMode("replicated", replicas=1), endpoint_spec=EndpointSpec(mode="dnsrr"),
    )["ID"]


def finished_task(api, service_id: str) -> dict | None:
    tasks = api.tasks(filters={"service": service_id})
    done = [t for t in tasks if t["Status"]["State"] in ("complete", "failed", "rejected", "shutdown")]
    return done[0] if done else None


def test_raw_services_pinned_to_each_node_talk_over_an_overlay_network(docker_api, node2_api, two_nodes):
    label = f"mn-raw-{uuid.uuid4().hex[:8]}"
    network_id = docker_api.create_network(label, driver="overlay", attachable=True, labels={TEST_LABEL: label})["Id"]
    services: dict[str, str] = {}
    try:
        # The overlay's DNS names are the service names.
        cluster = {"master": [f"{label}-master:2222"], "worker": [f"{label}-worker:2222"]}
        for task_type, node in (("master", "1"), ("worker", "2")):
            services[task_type] = create_talk_service(
                docker_api, f"{label}-{task_type}", network_id, task_type, node, cluster, label
            )
        tasks = {
            task_type: wait_for(lambda s=service: finished_task(docker_api, s), timeout=180, what=f"{task_type} to finish")
            for task_type, service in services.items()
        }
        logs = {task_type: service_logs(docker_api, service) for task_type, service in services.items()}
        for task in tasks.values():
            assert task["Status"]["State"] == "complete", (task["Status"], logs)
        assert node_hostname(docker_api, tasks["master"]["NodeID"]) == two_nodes["1"]
        assert node_hostname(docker_api, tasks["worker"]["NodeID"]) == two_nodes["2"]
        assert f"master-0 runs on node {two_nodes['1']}" in logs["master"], logs
        assert f"worker-0 runs on node {two_nodes['2']}" in logs["worker"], logs
        assert f"master-0 received: hello from worker-0 on {two_nodes['2']}" in logs["master"], logs
        assert f"worker-0 received: hello from master-0 on {two_nodes['1']}" in logs["worker"], logs
    finally:
        for service in services.values():
            docker_api.remove_service(service)
        wait_for(lambda: not containers_labelled((docker_api, node2_api), f"{TEST_LABEL}={label}"),
                 timeout=60, what="the services' containers to go")
        # The manager releases the network once every node has dropped its endpoints.
        wait_for(lambda: _removed(docker_api, network_id), timeout=60, what="the overlay network to go")


def _removed(api, network_id: str) -> bool:
    import docker.errors

    try:
        api.remove_network(network_id)
    except docker.errors.NotFound:
        return True
    except docker.errors.APIError:
        return False  # still has active endpoints
    return True


# --- aiptrain's swarm backend ------------------------------------------------------------------


class PlacementWatcher(threading.Thread):
    """Records on which node each of a job's replicas was scheduled, while the job runs (the
    backend may remove its services when the job ends)."""

    def __init__(self, api, job_id: str):
        super().__init__(daemon=True)
        self.api, self.job_id = api, job_id
        self.nodes: dict[str, str] = {}  # task name (master-replica-0) -> node hostname
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            try:
                for service in self.api.services(filters={"label": f"aiptrain.job-id={self.job_id}"}):
                    spec = service["Spec"]
                    labels = {**spec["TaskTemplate"]["ContainerSpec"].get("Labels", {}), **spec.get("Labels", {})}
                    name = labels.get("aiptrain.task-name", spec["Name"])
                    for task in self.api.tasks(filters={"service": service["ID"]}):
                        if task.get("NodeID"):
                            self.nodes[name] = node_hostname(self.api, task["NodeID"])
            except Exception:  # noqa: BLE001 - a service removed between the two calls
                pass
            self.done.wait(0.2)


def replica_lines(output: str) -> dict[str, list[str]]:
    """stream-logs lines (severity, time, task, trial, message) -> task name -> messages."""
    lines: dict[str, list[str]] = {}
    for line in output.splitlines():
        fields = line.split("\t")
        if len(fields) == 5:
            lines.setdefault(fields[2], []).append(fields[4])
    return lines


def node_of(messages: list[str]) -> str:
    """The node a replica printed it runs on ("unknown" when the backend does not say)."""
    return next((m.split()[4] for m in messages if " runs on node " in m), "unknown")


def test_aiptrain_custom_job_on_swarm_places_master_and_worker_on_different_nodes(
    cli, home, docker_api, node2_api, two_nodes, minimal_runtime, tmp_path, monkeypatch
):
    # Without the installation's storage endpoint (this trainer uses no gs://): its task is one
    # more on a node, and Swarm ranks nodes by their task count, so with it on the host node both
    # replicas could go to node2 (1 run in 10).
    monkeypatch.setenv("AIPTRAIN_GCS", "remote")
    job_id = f"mn_{uuid.uuid4().hex[:8]}"
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {
        "masterType": "n1-standard-4", "workerType": "n1-standard-4", "workerCount": 1,
    }}))
    watcher = PlacementWatcher(docker_api, job_id)
    watcher.start()
    try:
        cli(
            "jobs", "submit", "training", job_id, "--backend", "swarm",
            "--package-path", str(TRAINER), "--module-name", "node_talk.task",
            "--region", "us-central1", "--runtime-version", minimal_runtime,
            "--scale-tier", "CUSTOM", "--config", str(config),
            check_code=0,
        )
        logs = cli("jobs", "stream-logs", job_id, timeout=300, check_code=0)
    finally:
        watcher.done.set()
        watcher.join()
    job = yaml.safe_load(cli("jobs", "describe", job_id, check_code=0).stdout)
    messages = replica_lines(logs.stdout + logs.stderr)
    assert job["state"] == "SUCCEEDED", (job, messages)

    # The primary calls itself chief-0 or master-0, as its runtime's TF_CONFIG names it.
    master, worker = messages.get("master-replica-0", []), messages.get("worker-replica-0", [])
    assert any(m.endswith(" received: hello from worker-0 on " + node_of(worker)) for m in master), logs.stdout
    assert any(m.startswith("worker-0 received: hello from ") for m in worker), logs.stdout
    printed = {"master": node_of(master), "worker": node_of(worker)}
    # Where each replica ran: as the replica printed it (AIPTRAIN_NODE_HOSTNAME), else as the
    # swarm scheduled it.
    if "unknown" not in printed.values():
        placed = printed
    else:
        placed = {task: watcher.nodes.get(f"{task}-replica-0") for task in ("master", "worker")}
    assert set(placed.values()) == {two_nodes["1"], two_nodes["2"]}, (placed, watcher.nodes, messages)

    label = f"aiptrain.job-id={job_id}"
    wait_for(lambda: not docker_api.services(filters={"label": label}), timeout=60, what="the job's services to go")
    wait_for(lambda: not containers_labelled((docker_api, node2_api), label), timeout=60,
             what="the job's containers to go from both nodes")

"""The swarm backend's pure rules: task states as replica statuses, replicas as one-task services,
placement and GPUs, mounts carried to other nodes, the storage endpoint's service."""

import dataclasses

import pytest

from aiptrain.backends import ReplicaStatus
from aiptrain.backends.swarm import SwarmBackend, job_network
from aiptrain.backends.swarm_specs import (
    CONFIG_MAX_BYTES,
    NOT_A_MANAGER,
    TASK_STATES,
    Node,
    carried_files,
    check_gpus,
    config_reference,
    endpoint_service_spec,
    latest_task,
    meets,
    observation,
    service_spec,
    short_name,
    unshared_dirs,
)
from aiptrain.errors import EnvironmentNotReady, ValidationError
from aiptrain.planning import ContainerSpec, LaunchPlan, Mount, NetworkSpec
from aiptrain.storage.endpoint import SERVER_CODE, StorageEndpoint

LABELS = {"aiptrain.job-id": "j", "aiptrain.task-name": "worker-replica-1", "aiptrain.task-type": "worker",
          "aiptrain.task-index": "1"}


def task(state: str, exit_code: int | None = None, created: str = "2026-01-01T00:00:00Z"):
    status = {"State": state, "Timestamp": "2026-01-01T00:00:05.5Z"}
    if exit_code is not None:
        status["ContainerStatus"] = {"ContainerID": "c", "ExitCode": exit_code}
    return {"Status": status, "CreatedAt": created, "ServiceID": "s1"}


@pytest.mark.parametrize("state, status", [
    ("new", "created"), ("allocated", "created"), ("pending", "created"), ("assigned", "created"),
    ("accepted", "created"), ("preparing", "created"), ("ready", "created"), ("starting", "created"),
    ("running", "running"),
    ("complete", "exited"), ("failed", "exited"), ("shutdown", "exited"), ("rejected", "exited"),
    ("orphaned", "exited"), ("remove", "exited"),
])
def test_every_task_state_maps_to_one_replica_status(state, status):
    assert TASK_STATES[state].value == status


@pytest.mark.parametrize("the_task, status, exit_code, failed_at", [
    (None, ReplicaStatus.CREATED, None, False),  # the orchestrator has not made it yet
    (task("starting", 0), ReplicaStatus.CREATED, None, False),  # a starting task's 0 is no exit
    (task("running", 0), ReplicaStatus.RUNNING, None, False),
    (task("complete", 0), ReplicaStatus.EXITED, 0, False),
    (task("complete"), ReplicaStatus.EXITED, 0, False),  # the engine omits a zero ExitCode
    (task("failed"), ReplicaStatus.EXITED, None, True),  # failed before its container ran
    (task("failed", 137), ReplicaStatus.EXITED, 137, True),
    (task("rejected"), ReplicaStatus.EXITED, None, True),  # never ran: a failure without a status
])
def test_observation_of_a_service_and_its_latest_task(the_task, status, exit_code, failed_at):
    seen = observation({"ID": "s1", "Spec": {"Labels": LABELS, "Mode": {"Replicated": {"Replicas": 1}}}}, the_task)
    assert (seen.task_name, seen.task_type, seen.task_index, seen.container_id) == ("worker-replica-1", "worker", 1, "s1")
    assert (seen.status, seen.exit_code, seen.finished_at is not None) == (status, exit_code, failed_at)


def test_a_task_that_never_ran_fails_the_job_with_the_swarms_reason():
    from aiptrain.lifecycle import decide

    rejected = task("rejected")
    rejected["Status"]["Err"] = "No such image: trainer:1"
    seen = observation({"ID": "s1", "Spec": {"Labels": {**LABELS, "aiptrain.task-name": "master-replica-0"},
                                             "Mode": {"Replicated": {"Replicas": 1}}}}, rejected)
    assert (seen.exit_code, seen.error) == (None, "No such image: trainer:1")
    assert decide(["master-replica-0"], [seen], {}, 5).error_message == (
        "The replica master 0 did not run: No such image: trainer:1.")


def test_a_stopped_replica_whose_task_the_swarm_deleted_has_exited():
    service = {"ID": "s1", "Spec": {"Labels": LABELS, "Mode": {"Replicated": {"Replicas": 0}}}}
    seen = observation(service, None)
    assert (seen.status, seen.exit_code, seen.finished_at) == (ReplicaStatus.EXITED, None, None)
    assert observation(service, task("running")).status == ReplicaStatus.RUNNING  # still shutting down


def test_the_latest_task_is_the_latest_made():
    # fractions of a second of different lengths: compared as times, not as text
    first, rerun = task("failed", 137, created="2026-01-01T00:00:09.5Z"), task("running", created="2026-01-01T00:00:09.25Z")
    first["CreatedAt"], rerun["CreatedAt"] = "2026-01-01T00:00:09.123456789Z", "2026-01-01T00:00:09.5Z"
    assert latest_task([first, rerun]) is rerun
    assert latest_task([]) is None


def test_long_names_are_cut_with_a_digest_of_the_whole():
    assert short_name("job-master-0-abc", 63) == "job-master-0-abc"
    long_a, long_b = "a" * 70 + "-master-0", "a" * 70 + "-master-1"
    assert len(short_name(long_a, 63)) == 63 and short_name(long_a, 63) != short_name(long_b, 63)


def spec(**changes) -> ContainerSpec:
    values = {
        "name": "j-worker-1-inst", "hostname": "j-worker-1", "task_name": "worker-replica-1", "task_type": "worker",
        "task_index": 1, "image": "img", "entrypoint": None, "command": ["sh", "-c", "x"], "env": {"A": "1"},
        "mounts": (Mount("/pk", "/opt/aiptrain/packages"), Mount("/out", "/out", read_only=False)),
        "labels": LABELS, "user": "1000:1000", "shm_bytes": 1 << 30, "pids_limit": 4096,
    }
    return ContainerSpec(**{**values, **changes})


def test_a_replica_becomes_a_one_task_service_on_the_job_network():
    config = {"ConfigID": "c1", "ConfigName": "n-0", "File": {"Name": "/opt/aiptrain/packages/t.tar.gz",
                                                               "UID": "1000", "GID": "1000", "Mode": 0o444}}
    built = service_spec(spec(), {"TF_CONFIG": "{}", "A": "1"}, "net", [config], ("node.role==manager",), 10)
    assert built == {
        "name": "j-worker-1-inst",
        "labels": LABELS,
        "mode": {"replicated": {"Replicas": 1}},  # one task, never restarted by the swarm (docker-py's spelling)
        "endpoint_spec": {"Mode": "dnsrr"},
        "task_template": {
            "ContainerSpec": {
                "Image": "img", "Command": None, "Args": ["sh", "-c", "x"], "Hostname": "j-worker-1", "Env": ["TF_CONFIG={}", "A=1"],
                "Dir": "/tmp", "User": "1000:1000", "Labels": LABELS,
                "Mounts": [{"Target": "/out", "Source": "/out", "Type": "bind", "ReadOnly": False},
                           {"Target": "/dev/shm", "Source": None, "Type": "tmpfs", "ReadOnly": False,
                            "TmpfsOptions": {"SizeBytes": 1 << 30}}],
                "Configs": [config], "Init": True, "CapabilityDrop": ["ALL"], "StopGracePeriod": 10_000_000_000,
            },
            "Resources": {"Limits": {"Pids": 4096}},  # no CPU or memory reservation (module docstring)
            "RestartPolicy": {"Condition": "none", "Delay": 0, "MaxAttempts": 0, "Window": 0},
            "Placement": {"Constraints": ["node.role==manager"]},
            "Networks": [{"Target": "net", "Aliases": ["j-worker-1"], "DriverOpts": None}],
        },
    }


def test_limits_and_gpus_go_into_the_service_resources():
    built = service_spec(spec(gpus=2, nano_cpus=500_000_000, memory_bytes=1 << 30, pids_limit=None,
                              entrypoint=["python3"], command=[]), {}, "net", [], (), 10)
    assert built["task_template"]["Resources"] == {
        "Limits": {"NanoCPUs": 500_000_000, "MemoryBytes": 1 << 30},
        "Reservations": {"GenericResources": [{"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU", "Value": 2}}]},
    }
    container = built["task_template"]["ContainerSpec"]
    assert (container["Command"], container["Args"]) == (["python3"], None)  # the image's CMD stays
    assert "Placement" not in built["task_template"]


def test_a_replica_joins_its_jobs_network_only():
    built = service_spec(spec(), {}, "net", [], (), 10)
    assert built["task_template"]["Networks"] == [{"Target": "net", "Aliases": ["j-worker-1"], "DriverOpts": None}]
    assert "Networks" not in service_spec(spec(), {}, None, [], (), 10)["task_template"]


def test_a_lone_replica_that_reaches_gs_gets_a_network_of_its_own_for_its_endpoint():
    lone = dataclasses.replace(spec(), name="aiptrain-j-master-0",
                               labels={"aiptrain.job-id": "j", "aiptrain.installation": "i", "aiptrain.task-name": "m"})
    without = LaunchPlan("j", None, (lone,))
    assert job_network(without) is None  # its own hostname is in its /etc/hosts
    network = job_network(dataclasses.replace(without, storage=ENDPOINT))
    assert network == NetworkSpec("aiptrain-j-master-0-net", {"aiptrain.job-id": "j", "aiptrain.installation": "i"}, 1)
    shared = NetworkSpec("aiptrain-j", {"aiptrain.job-id": "j"}, 3)
    assert job_network(LaunchPlan("j", shared, (lone,), storage=ENDPOINT)) is shared


ENDPOINT = StorageEndpoint(gcs_root="/h/gcs", tls_dir="/h/storage-endpoint", user="65534:65534",
                           installation="abcdef0123456789", images=("aiptrain/runtime:2.11",))


def test_a_jobs_storage_endpoint_is_one_unprivileged_task_on_the_manager_under_googles_names():
    built = endpoint_service_spec(ENDPOINT, "aiptrain/runtime:2.11", "gcs-net", "node1", {"l": "v"}, "job-net-gcs")
    template = built["task_template"]
    container = template["ContainerSpec"]
    assert built["name"] == "job-net-gcs" and built["mode"] == {"replicated": {"Replicas": 1}}
    assert built["labels"] == container["Labels"] == {"l": "v"}  # the job's teardown finds its container too
    assert template["Placement"] == {"Constraints": ["node.id==node1"]}  # where the gcs tree is
    assert template["Networks"] == [{"Target": "gcs-net", "DriverOpts": None, "Aliases": [
        "www.googleapis.com", "storage.googleapis.com", "oauth2.googleapis.com"]}]
    assert container["Command"][container["Command"].index("--port") + 1] == "443"  # replicas reach its own address
    assert container["Sysctls"] == {"net.ipv4.ip_unprivileged_port_start": "443"}  # no capability to bind it
    assert (container["User"], container["ReadOnly"], container["CapabilityDrop"], container["Init"]) == (
        "65534:65534", True, ["ALL"], True)
    assert {(m["Source"], m["Target"], m["ReadOnly"]) for m in container["Mounts"]} == {
        ("/h/gcs", "/gcs", False), (str(SERVER_CODE), "/opt/aiptrain/endpoint/server.py", True),
        ("/h/storage-endpoint", "/opt/aiptrain/endpoint/tls", True), (None, "/tmp", False)}
    assert template["RestartPolicy"]["Condition"] == "any" and template["Resources"] == {"Limits": {"Pids": 512}}


def test_carried_tools_stay_executable():
    assert config_reference("c", "n", "/opt/aiptrain/bin/gsutil", "1000:1000", executable=True)["File"]["Mode"] == 0o555
    assert config_reference("c", "n", "/opt/aiptrain/storage/trust.pem", "1000:1000")["File"]["Mode"] == 0o444


GIB = 1 << 30


@pytest.mark.parametrize("gpus, nodes, fits", [
    ((), [Node(2_000_000_000, GIB)], True),
    ((1,), [Node(2_000_000_000, GIB, gpus=1)], True),
    ((1, 1), [Node(2_000_000_000, GIB, gpus=1)] * 2, True),  # one on each node
    ((2, 1), [Node(2_000_000_000, GIB, gpus=2)] * 2, True),
    ((2,), [Node(2_000_000_000, GIB, gpus=1)] * 2, False),  # a replica's GPUs are on one node
    ((1, 1), [Node(2_000_000_000, GIB, gpus=1)], False),
])
def test_gpus_must_fit_the_nodes_at_once(gpus, nodes, fits):
    specs = tuple(spec(gpus=count) for count in gpus)
    if fits:
        check_gpus(specs, nodes)
    else:
        with pytest.raises(ValidationError, match="GPU.*submit without accelerators, or add GPU nodes"):
            check_gpus(specs, nodes)


def test_read_only_mounts_are_carried_file_by_file_and_big_files_refused(tmp_path):
    (tmp_path / "pk" / "wheelhouse").mkdir(parents=True)
    (tmp_path / "pk" / "t.tar.gz").write_bytes(b"t")
    (tmp_path / "pk" / "wheelhouse" / "d.whl").write_bytes(b"d")
    (tmp_path / "key.json").write_bytes(b"{}")
    mounts = (Mount(str(tmp_path / "pk"), "/opt/p"), Mount(str(tmp_path / "key.json"), "/etc/key.json"),
              Mount(str(tmp_path), "/out", read_only=False))
    assert carried_files(mounts) == [(tmp_path / "pk" / "t.tar.gz", "/opt/p/t.tar.gz"),
                                     (tmp_path / "pk" / "wheelhouse" / "d.whl", "/opt/p/wheelhouse/d.whl"),
                                     (tmp_path / "key.json", "/etc/key.json")]
    (tmp_path / "pk" / "big.whl").write_bytes(b"x" * (CONFIG_MAX_BYTES + 1))
    with pytest.raises(ValidationError, match=r"\[big.whl\] is 1.0 MB: a swarm carries"):
        carried_files(mounts)


def test_writable_mounts_outside_the_shared_dirs_are_named(tmp_path):
    mounts = (Mount("/pk", "/opt/p"), Mount(str(tmp_path / "a" / "out"), "/x", read_only=False),
              Mount("/elsewhere", "/y", read_only=False))
    assert unshared_dirs(mounts, (str(tmp_path / "a"),)) == ["/elsewhere"]
    assert unshared_dirs(mounts, ()) == [str(tmp_path / "a" / "out"), "/elsewhere"]


NODE = {"ID": "n1", "Spec": {"Role": "manager", "Labels": {"gpu": "true"}},
        "Description": {"Hostname": "vm", "Platform": {"OS": "linux", "Architecture": "x86_64"},
                        "Engine": {"Labels": {"zone": "a"}}}}


@pytest.mark.parametrize("constraint, met", [
    ("node.role==manager", True), ("node.role == worker", False), ("node.role!=worker", True),
    ("node.hostname==VM", True), ("node.id==n2", False), ("node.platform.os==linux", True),
    ("node.labels.gpu==true", True), ("node.labels.disk==ssd", False), ("node.labels.disk!=ssd", True),
    ("engine.labels.zone==a", True),
])
def test_placement_constraints_select_the_nodes_whose_capacity_counts(constraint, met):
    assert meets(NODE, constraint) is met


def test_a_local_job_dir_is_refused_on_several_nodes_unless_declared_shared(tmp_path):
    (tmp_path / "pk").mkdir()
    plan = LaunchPlan("j", NetworkSpec("n", {}), (spec(mounts=(Mount(str(tmp_path / "pk"), "/opt/p"),
                                                                 Mount("/data/out", "/data/out", read_only=False))),))
    SwarmBackend()._check_mounts(plan, node_count=1)  # one node: the bind mount is this host's
    with pytest.raises(ValidationError, match=r"write to \[/data/out\], a directory of this machine that the other "
                                              r"nodes of the swarm \(2 nodes\) do not see: use a gs:// --job-dir"):
        SwarmBackend()._check_mounts(plan, node_count=2)
    SwarmBackend(shared_dirs=("/data",))._check_mounts(plan, node_count=2)


class _NoSwarm:
    def info(self):
        return {"Swarm": {"LocalNodeState": "inactive"}}


def test_an_engine_that_is_no_swarm_manager_is_not_ready():
    plan = LaunchPlan("j", NetworkSpec("n", {}), (spec(),))
    with pytest.raises(EnvironmentNotReady, match="docker swarm init") as raised:
        SwarmBackend(client=_NoSwarm()).check_ready(plan)
    assert str(raised.value) == NOT_A_MANAGER and raised.value.exit_code == 3

"""The swarm backend: pure pieces (task states, service specs, reservations, carried files)
table-tested, then jobs on a real single-node Docker Swarm, driven by the same commands as a
docker job. A module fixture makes this engine a swarm manager if it is not one and leaves
the swarm at the end only if it made it."""

import io
import os
import socket
import tarfile
import threading
import uuid
from pathlib import Path

import pytest
import yaml

from aiptrain.backends import ReplicaStatus
from aiptrain.backends.swarm import (
    CONFIG_MAX_BYTES,
    NOT_A_MANAGER,
    STORAGE_ROLE,
    TASK_STATES,
    Node,
    SwarmBackend,
    carried_files,
    check_gpus,
    config_reference,
    endpoint_current,
    endpoint_service_spec,
    latest_task,
    meets,
    observation,
    service_spec,
    short_name,
    unshared_dirs,
)
from aiptrain.errors import AiptrainError, EnvironmentNotReady, ValidationError
from aiptrain.planning import ContainerSpec, LaunchPlan, Mount, NetworkSpec
from aiptrain.storage.endpoint import LABEL_CODE, SERVER_CODE, StorageEndpoint, code_digest

from conftest import job_resources, require_image, runtime_image, wait_for

PROBE = Path(__file__).parent / "trainers" / "probe"
PS_JOB = ("--scale-tier", "custom", "--master-machine-type", "n1-standard-4",
          "--worker-machine-type", "n1-standard-4", "--worker-count", "1",
          "--parameter-server-machine-type", "n1-standard-4", "--parameter-server-count", "1")
LABELS = {"aiptrain.job-id": "j", "aiptrain.task-name": "worker-replica-1", "aiptrain.task-type": "worker",
          "aiptrain.task-index": "1"}


# -- pure -----------------------------------------------------------------------------------


@pytest.mark.parametrize("state, status", [
    ("new", "created"), ("allocated", "created"), ("pending", "created"), ("assigned", "created"),
    ("accepted", "created"), ("preparing", "created"), ("ready", "created"), ("starting", "created"),
    ("running", "running"),
    ("complete", "exited"), ("failed", "exited"), ("shutdown", "exited"), ("rejected", "exited"),
    ("orphaned", "exited"), ("remove", "exited"),
])
def test_every_task_state_maps_to_one_replica_status(state, status):
    assert TASK_STATES[state].value == status


def task(state: str, exit_code: int | None = None, created: str = "2026-01-01T00:00:00Z"):
    status = {"State": state, "Timestamp": "2026-01-01T00:00:05.5Z"}
    if exit_code is not None:
        status["ContainerStatus"] = {"ContainerID": "c", "ExitCode": exit_code}
    return {"Status": status, "CreatedAt": created, "ServiceID": "s1"}


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


def test_a_replica_of_a_job_that_reaches_gs_joins_the_storage_network_too():
    built = service_spec(spec(), {}, "net", [], (), 10, storage_network="gcs-net")
    assert built["task_template"]["Networks"] == [{"Target": "net", "Aliases": ["j-worker-1"], "DriverOpts": None},
                                                  {"Target": "gcs-net", "Aliases": None, "DriverOpts": None}]
    lone = service_spec(spec(), {}, None, [], (), 10, storage_network="gcs-net")
    assert lone["task_template"]["Networks"] == [{"Target": "gcs-net", "Aliases": None, "DriverOpts": None}]
    assert "Networks" not in service_spec(spec(), {}, None, [], (), 10)["task_template"]


ENDPOINT = StorageEndpoint(gcs_root="/h/gcs", tls_dir="/h/storage-endpoint", user="65534:65534",
                           installation="abcdef0123456789", images=("aiptrain/runtime:2.11",))


def test_the_storage_endpoint_is_one_unprivileged_task_on_the_manager_under_googles_names():
    built = endpoint_service_spec(ENDPOINT, "aiptrain/runtime:2.11", "gcs-net", "node1", {"l": "v"})
    template = built["task_template"]
    container = template["ContainerSpec"]
    assert built["name"] == "aiptrain-storage-abcdef01" and built["mode"] == {"replicated": {"Replicas": 1}}
    assert template["Placement"] == {"Constraints": ["node.id==node1"]}  # where the gcs tree is
    assert template["Networks"] == [{"Target": "gcs-net", "Aliases": ["www.googleapis.com", "storage.googleapis.com"],
                                     "DriverOpts": None}]
    assert container["Command"][container["Command"].index("--port") + 1] == "443"  # replicas reach its own address
    assert container["Sysctls"] == {"net.ipv4.ip_unprivileged_port_start": "443"}  # no capability to bind it
    assert (container["User"], container["ReadOnly"], container["CapabilityDrop"], container["Init"]) == (
        "65534:65534", True, ["ALL"], True)
    assert {(m["Source"], m["Target"], m["ReadOnly"]) for m in container["Mounts"]} == {
        ("/h/gcs", "/gcs", False), (str(SERVER_CODE), "/opt/aiptrain/endpoint/server.py", True),
        ("/h/storage-endpoint", "/opt/aiptrain/endpoint/tls", True), (None, "/tmp", False)}
    assert template["RestartPolicy"]["Condition"] == "any" and template["Resources"] == {"Limits": {"Pids": 512}}


def test_an_endpoint_service_is_kept_only_with_this_code_on_this_network():
    def service(code: str, network: str) -> dict:
        return {"Spec": {"Labels": {LABEL_CODE: code}, "TaskTemplate": {"Networks": [{"Target": network}]}}}

    assert endpoint_current(service(code_digest(), "n1"), code_digest(), "n1")
    assert not endpoint_current(service("0ld", "n1"), code_digest(), "n1")
    assert not endpoint_current(service(code_digest(), "n0"), code_digest(), "n1")


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


# -- on a real single-node swarm --------------------------------------------------------------


def default_route_address() -> str:
    """This host's address on its default route (what `ip -4 route get 1.1.1.1` says): a second
    node can join a swarm advertised there, not one on 127.0.0.1. No packet is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("1.1.1.1", 53))
        return probe.getsockname()[0]


@pytest.fixture(scope="module")  # left as soon as these tests are done: others run on a plain engine
def swarm(docker_api):
    """This engine as a swarm manager; a swarm made here is left (with the docker_gwbridge
    network it leaves behind) at the end unless others run services on it meanwhile; one that
    was there before is kept."""
    made = docker_api.info()["Swarm"].get("LocalNodeState") != "active"
    if made:
        docker_api.init_swarm(advertise_addr=default_route_address())
    yield docker_api
    if made and docker_api.info()["Swarm"].get("LocalNodeState") == "active" and not docker_api.services():
        docker_api.leave_swarm(force=True)
        try:
            docker_api.remove_network("docker_gwbridge")
        except Exception:  # noqa: BLE001 - still in use by something else, or gone
            pass


@pytest.fixture
def on_swarm(swarm, home, tmp_path, monkeypatch, minimal_runtime):
    """Replicas on this node (`docker kill` reaches them; another node joined meanwhile may lack
    the images), and the tests' job dirs declared shared in case another node joined."""
    monkeypatch.setenv("AIPTRAIN_SWARM_CONSTRAINTS", "node.role==manager")
    monkeypatch.setenv("AIPTRAIN_SWARM_SHARED_DIRS", str(tmp_path))
    return swarm


def swarm_resources(api, job_id: str) -> list[str]:
    """Services, configs, containers and networks of the job still on the engine."""
    label = {"label": f"aiptrain.job-id={job_id}"}
    return ([s["Spec"]["Name"] for s in api.services(filters=label)]
            + [c["Spec"]["Name"] for c in api.configs(filters=label)] + job_resources(api, job_id))


def probe_job(job_id: str, tmp_path: Path, *extra: str, user_args: tuple[str, ...] = ()) -> list[str]:
    return ["jobs", "submit", "training", job_id, "--backend", "swarm", "--package-path", str(PROBE),
            "--module-name", "probe.task", "--job-dir", str(tmp_path / job_id), "--runtime-version", "minimal",
            *extra, "--", *user_args]


def state_of(cli, job_id: str) -> dict:
    return yaml.safe_load(cli("jobs", "describe", job_id, check_code=0).stdout)


def task_lines(stderr: str) -> set[str]:
    return {line.split("\t")[2] for line in stderr.splitlines() if line.count("\t") == 4}


def running_container(api, job_id: str, task: str) -> dict | None:
    found = api.containers(filters={"label": [f"aiptrain.job-id={job_id}", f"aiptrain.task-name={task}"],
                                    "status": "running"})
    return found[0] if found else None


@pytest.mark.docker
@pytest.mark.tensorflow
def test_parameter_server_strategy_sample_succeeds_on_swarm(cli, on_swarm, tmp_path):
    from test_tensorflow_jobs import assert_trained, custom_job_args, replica_messages

    require_image(on_swarm, runtime_image("2.11"))
    job_id = f"swarm_ps_{uuid.uuid4().hex[:6]}"
    args = custom_job_args(job_id, "tf_parameter_server", tmp_path / "ps-out",
                           "--parameter-server-machine-type", "n1-standard-4", "--parameter-server-count", "1")
    result = cli(*args[:4], "--backend", "swarm", *args[4:], timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    assert state_of(cli, job_id)["state"] == "SUCCEEDED"
    for task, index in (("worker", 0), ("worker", 1), ("ps", 0)):
        assert f"{task} {index} serving at grpc://{job_id.replace('_', '-')}-{task}-{index}:2222" in replica_messages(
            result.stderr, f"{task}-replica-{index}"
        )
    assert_trained(result.stderr, "chief: trained")
    assert (tmp_path / "ps-out" / "checkpoints" / "checkpoint").is_file()
    assert swarm_resources(on_swarm, job_id) == []


@pytest.mark.docker
def test_master_success_stops_the_others_and_every_replica_logs(cli, on_swarm, tmp_path):
    result = cli(*probe_job("sw_ok", tmp_path, *PS_JOB, "--stream-logs", user_args=("--run", "chief=1")))
    assert result.returncode == 0, result.stderr
    assert {"master-replica-0", "worker-replica-0", "ps-replica-0", "service"} <= task_lines(result.stderr)
    assert "probe ps 0 says hello on stderr" in result.stderr
    assert (tmp_path / "sw_ok" / "done.txt").read_text() == "ok"  # the job dir, bind-mounted
    assert state_of(cli, "sw_ok")["state"] == "SUCCEEDED"
    assert cli("jobs", "stream-logs", "sw_ok", "--task-name", "ps-replica-0", check_code=0).stdout
    assert swarm_resources(on_swarm, "sw_ok") == []


@pytest.mark.docker
def test_failing_master_fails_the_job_with_its_exit_status(cli, on_swarm, tmp_path):
    result = cli(*probe_job("sw_fail", tmp_path, "--stream-logs", user_args=("--exit", "chief:0=3")))
    assert result.returncode == 1, result.stderr
    job = state_of(cli, "sw_fail")
    assert job["state"] == "FAILED"
    assert "The replica master 0 exited with a non-zero status of 3." in job["errorMessage"]
    assert swarm_resources(on_swarm, "sw_fail") == []


@pytest.mark.docker
def test_replica_killed_by_sigkill_is_restarted_and_the_job_succeeds(cli, on_swarm, tmp_path, home):
    cli(*probe_job("sw_kill", tmp_path, user_args=("--run", "chief=6")), check_code=0)
    log = home / "logs" / "sw_kill.jsonl"
    wait_for(lambda: "probe chief 0 started" in log.read_text(), timeout=60, what="the master's first line")
    master = running_container(on_swarm, "sw_kill", "master-replica-0")
    on_swarm.kill(master["Id"], signal="SIGKILL")  # exit 137, as kill -9 of the replica
    wait_for(lambda: state_of(cli, "sw_kill")["state"] in ("SUCCEEDED", "FAILED"), timeout=90, what="end")
    assert state_of(cli, "sw_kill")["state"] == "SUCCEEDED"
    logs = cli("jobs", "stream-logs", "sw_kill", check_code=0).stdout
    assert "exited with a non-zero status of 137. Restarting it in place (restart 1 of 5)" in logs
    assert logs.count("probe chief 0 started") == 2 and "probe chief 0 exiting with 0" in logs
    assert swarm_resources(on_swarm, "sw_kill") == []


@pytest.mark.docker
def test_cancel_mid_run_leaves_nothing_behind(cli, on_swarm, tmp_path):
    cli(*probe_job("sw_cancel", tmp_path, *PS_JOB, user_args=("--run", "chief=120")), check_code=0)
    wait_for(lambda: running_container(on_swarm, "sw_cancel", "master-replica-0"), timeout=60, what="master")
    streamed: list[str] = []
    stream = threading.Thread(target=lambda: streamed.append(cli("jobs", "stream-logs", "sw_cancel").stdout))
    stream.start()
    cli("jobs", "cancel", "sw_cancel", check_code=0)
    stream.join(60)
    assert "Job cancelled." in streamed[0]
    assert state_of(cli, "sw_cancel")["state"] == "CANCELLED"
    assert wait_for(lambda: swarm_resources(on_swarm, "sw_cancel") == [], timeout=30, what="clean-up")


@pytest.mark.docker
def test_a_package_too_big_for_a_config_is_refused_with_nothing_left(cli, on_swarm, tmp_path):
    big = tmp_path / "big-1.0.tar.gz"
    with tarfile.open(big, "w:gz") as sdist:  # a real sdist, incompressible
        for name, data in (("PKG-INFO", b"Metadata-Version: 2.1\nName: big\nVersion: 1.0\n"),
                           ("blob", os.urandom(CONFIG_MAX_BYTES))):
            info = tarfile.TarInfo(f"big-1.0/{name}")
            info.size = len(data)
            sdist.addfile(info, io.BytesIO(data))
    result = cli(*probe_job("sw_big", tmp_path, "--packages", str(big)))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [(
        "ERROR: [big-1.0.tar.gz] is 1.0 MB: a swarm carries a job's files to its nodes as Swarm configs of under "
        "1 MB each. Build an image with it installed and present on every node (--master-image-uri), or submit "
        "with --backend docker."
    )]
    assert cli("jobs", "describe", "sw_big").returncode == 2
    assert swarm_resources(on_swarm, "sw_big") == []


@pytest.mark.docker
def test_gpus_no_node_offers_are_refused_with_nothing_left(cli, on_swarm, tmp_path):
    result = cli(*probe_job("sw_gpu", tmp_path, "--scale-tier", "custom", "--master-machine-type", "n1-standard-4",
                            "--master-accelerator", "count=1,type=nvidia-tesla-t4"))
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "submit without accelerators" in result.stderr
    assert cli("jobs", "describe", "sw_gpu").returncode == 2
    assert swarm_resources(on_swarm, "sw_gpu") == []


GCS_TRAINER = """
    import argparse
    import json
    import os
    import subprocess

    from google.cloud import storage

    parser = argparse.ArgumentParser()
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--job-dir", required=True)
    args = parser.parse_args()
    task = json.loads(os.environ["TF_CONFIG"])["task"]["type"]

    bucket = storage.Client().bucket(args.bucket)  # a bucket named by a flag, paths built here
    print(task, "staged", bucket.blob("data/hello.txt").download_as_text().strip())
    out = args.job_dir.rstrip("/")
    name = out[len("gs://" + args.bucket + "/"):] + "/" + task + "-client.txt"
    bucket.blob(name).upload_from_string("written by google-cloud-storage")
    print(task, "client read back", bucket.blob(name).download_as_text())
    try:
        import tensorflow as tf
    except ImportError:
        tf = None
    if tf is not None:  # TensorFlow's own GCS filesystem
        with tf.io.gfile.GFile(out + "/" + task + "-gfile.txt", "w") as handle:
            handle.write("written by tf.io.gfile")
        print(task, "gfile read back", tf.io.gfile.GFile(out + "/" + task + "-gfile.txt").read())
    print(task, "gsutil cat", subprocess.check_output(["gsutil", "cat", "gs://" + args.bucket + "/" + name]).decode())
"""


@pytest.mark.docker
@pytest.mark.tensorflow
def test_replicas_reach_gs_through_the_storage_endpoint_and_it_goes_with_the_last_job(
    cli, on_swarm, gcs_home, tmp_path
):
    from test_gcs_endpoint import package, stage

    require_image(on_swarm, runtime_image("2.11"))
    stage(gcs_home, tmp_path, "sw-data", {"data/hello.txt": "hello from the host\n"})
    job_id = f"sw_gcs_{uuid.uuid4().hex[:6]}"
    result = cli("jobs", "submit", "training", job_id, "--backend", "swarm", "--package-path",
                 str(package(tmp_path, "sw_gcs", task=GCS_TRAINER)), "--module-name", "trainer.task",
                 "--runtime-version", "2.11", "--job-dir", "gs://sw-data/run", "--stream-logs", "--scale-tier", "custom",
                 "--master-machine-type", "n1-standard-4", "--worker-machine-type", "n1-standard-4",
                 "--worker-count", "1", "--", "--bucket", "sw-data", timeout=600)
    assert result.returncode == 0, result.stderr[-6000:]
    out = gcs_home / "gcs" / "sw-data" / "run"
    for task in ("chief", "worker"):  # TF_CONFIG's name of the master on runtime 2.x
        assert f"{task} staged hello from the host" in result.stderr
        assert f"{task} client read back written by google-cloud-storage" in result.stderr
        assert f"{task} gsutil cat written by google-cloud-storage" in result.stderr
        assert (out / f"{task}-client.txt").read_text() == "written by google-cloud-storage"  # a plain file here
        assert f"{task} gfile read back written by tf.io.gfile" in result.stderr
        assert (out / f"{task}-gfile.txt").read_text() == "written by tf.io.gfile"
    assert swarm_resources(on_swarm, job_id) == []
    assert wait_for(lambda: shared_on_swarm(on_swarm) == [], timeout=120, what="the storage endpoint to go")


@pytest.mark.docker
@pytest.mark.tensorflow
def test_a_study_on_swarm_reads_its_trials_summaries_written_to_gs(cli, on_swarm, gcs_home, tmp_path, monkeypatch):
    from test_gcs_endpoint import run_a_gs_study

    require_image(on_swarm, runtime_image("2.11"))
    run_a_gs_study(cli, gcs_home, tmp_path, monkeypatch, "2.11", "--backend", "swarm")
    assert swarm_resources(on_swarm, "gs_study") == []
    assert wait_for(lambda: shared_on_swarm(on_swarm) == [], timeout=120, what="the storage endpoint to go")


def shared_on_swarm(api) -> list[str]:
    """The installation's storage endpoint service and network: released after its last job's end."""
    from aiptrain.settings import Settings

    owner = f"aiptrain.installation={Settings().installation_id}"
    return ([s["Spec"]["Name"] for s in api.services(filters={"label": [owner, "aiptrain.role"]})]
            + [n["Name"] for n in api.networks(filters={"label": [owner, f"aiptrain.role={STORAGE_ROLE}"]})])


@pytest.mark.docker
def test_a_lone_replica_reaches_gs_and_each_job_after_a_release_starts_the_endpoint_again(
    cli, on_swarm, gcs_home, tmp_path
):
    from test_gcs_endpoint import PROBE, package, stage

    stage(gcs_home, tmp_path, "probe-data", {"hello.txt": "hello from the host\n"})
    trainer = package(tmp_path, "probe", task=PROBE)
    for attempt in range(2):
        job_id = f"sw_lone{attempt}_{uuid.uuid4().hex[:6]}"
        result = cli("jobs", "submit", "training", job_id, "--backend", "swarm", "--package-path", str(trainer),
                     "--module-name", "trainer.task", "--runtime-version", "minimal", "--stream-logs")
        assert result.returncode == 0 and "read hello from the host" in result.stderr, result.stderr[-3000:]
        assert swarm_resources(on_swarm, job_id) == []
        assert wait_for(lambda: shared_on_swarm(on_swarm) == [], timeout=120, what="the storage endpoint to go")


@pytest.mark.docker
def test_an_endpoint_that_cannot_start_is_reported_and_remove_installation_takes_it_away(on_swarm, tmp_path):
    (tmp_path / "gcs").mkdir()
    (tmp_path / "tls").mkdir()  # no certificate, no key: the server exits at once
    installation = uuid.uuid4().hex
    endpoint = StorageEndpoint(gcs_root=str(tmp_path / "gcs"), tls_dir=str(tmp_path / "tls"), user="65534:65534",
                               installation=installation, images=(runtime_image("minimal"),))
    backend = SwarmBackend(installation, client=on_swarm, home=str(tmp_path))
    require_image(on_swarm, runtime_image("minimal"))
    with pytest.raises(AiptrainError, match="The storage endpoint for gs:// did not start"):
        backend.ensure_storage_endpoint(endpoint)
    backend.remove_installation()
    owner = f"aiptrain.installation={installation}"
    assert on_swarm.services(filters={"label": owner}) == []
    assert on_swarm.networks(filters={"label": owner}) == []

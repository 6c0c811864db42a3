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

from aiptrain.backends.swarm import SwarmBackend
from aiptrain.backends.swarm_endpoint import STORAGE_ROLE
from aiptrain.backends.swarm_specs import CONFIG_MAX_BYTES
from aiptrain.errors import AiptrainError
from aiptrain.storage.endpoint import API_HOSTS, TLS_FILES, StorageEndpoint

from conftest import job_resources, require_image, runtime_image, wait_for

PROBE = Path(__file__).parents[1] / "trainers" / "probe"
PS_JOB = ("--scale-tier", "custom", "--master-machine-type", "n1-standard-4",
          "--worker-machine-type", "n1-standard-4", "--worker-count", "1",
          "--parameter-server-machine-type", "n1-standard-4", "--parameter-server-count", "1")


# -- pure -----------------------------------------------------------------------------------


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


def test_master_success_stops_the_others_and_every_replica_logs(cli, on_swarm, tmp_path):
    result = cli(*probe_job("sw_ok", tmp_path, *PS_JOB, "--stream-logs", user_args=("--run", "chief=1")))
    assert result.returncode == 0, result.stderr
    assert {"master-replica-0", "worker-replica-0", "ps-replica-0", "service"} <= task_lines(result.stderr)
    assert "probe ps 0 says hello on stderr" in result.stderr
    assert (tmp_path / "sw_ok" / "done.txt").read_text() == "ok"  # the job dir, bind-mounted
    assert state_of(cli, "sw_ok")["state"] == "SUCCEEDED"
    assert cli("jobs", "stream-logs", "sw_ok", "--task-name", "ps-replica-0", check_code=0).stdout
    assert swarm_resources(on_swarm, "sw_ok") == []


def test_failing_master_fails_the_job_with_its_exit_status(cli, on_swarm, tmp_path):
    result = cli(*probe_job("sw_fail", tmp_path, "--stream-logs", user_args=("--exit", "chief:0=3")))
    assert result.returncode == 1, result.stderr
    job = state_of(cli, "sw_fail")
    assert job["state"] == "FAILED"
    assert "The replica master 0 exited with a non-zero status of 3." in job["errorMessage"]
    assert swarm_resources(on_swarm, "sw_fail") == []


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


@pytest.mark.tensorflow
def test_a_study_on_swarm_reads_its_trials_summaries_written_to_gs(cli, on_swarm, gcs_home, tmp_path, monkeypatch):
    from test_gcs_endpoint import assert_a_gs_study_reads_every_trials_metric

    require_image(on_swarm, runtime_image("2.11"))
    assert_a_gs_study_reads_every_trials_metric(cli, gcs_home, tmp_path, monkeypatch, "2.11", "--backend", "swarm")
    assert swarm_resources(on_swarm, "gs_study") == []
    assert wait_for(lambda: shared_on_swarm(on_swarm) == [], timeout=120, what="the storage endpoint to go")


def shared_on_swarm(api) -> list[str]:
    """The installation's storage endpoint service and network: released after its last job's end."""
    from aiptrain.settings import Settings

    owner = f"aiptrain.installation={Settings().installation_id}"
    return ([s["Spec"]["Name"] for s in api.services(filters={"label": [owner, "aiptrain.role"]})]
            + [n["Name"] for n in api.networks(filters={"label": [owner, f"aiptrain.role={STORAGE_ROLE}"]})])


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


def endpoint_on_a_network(api, backend: SwarmBackend, endpoint: StorageEndpoint, job_id: str) -> None:
    """A job's endpoint as its launch starts it: on the job's network, labelled as the job."""
    from aiptrain.planning import NetworkSpec

    network = NetworkSpec(f"aiptrain-{job_id}", {"aiptrain.job-id": job_id, "aiptrain.installation":
                                                 backend.engine.installation}, 2)
    backend.networks.create(network)
    backend.storage.start_for_job(endpoint, network.name, network.labels)


def test_an_endpoint_that_cannot_start_is_reported_and_the_jobs_removal_takes_it_away(on_swarm, tmp_path):
    (tmp_path / "gcs").mkdir()
    (tmp_path / "tls").mkdir()
    for name in TLS_FILES:  # there, so they are not made; not a certificate: the server exits at once
        (tmp_path / "tls" / name).write_text("not PEM\n")
    (tmp_path / "tls" / "hosts").write_text(" ".join(API_HOSTS))
    installation = uuid.uuid4().hex
    endpoint = StorageEndpoint(gcs_root=str(tmp_path / "gcs"), tls_dir=str(tmp_path / "tls"), user="65534:65534",
                               installation=installation, images=(runtime_image("minimal"),))
    backend = SwarmBackend(installation, client=on_swarm, home=str(tmp_path))
    require_image(on_swarm, runtime_image("minimal"))
    with pytest.raises(AiptrainError, match="The storage endpoint for gs:// did not start"):
        endpoint_on_a_network(on_swarm, backend, endpoint, "endpoint_fails")
    backend.remove("endpoint_fails")
    owner = f"aiptrain.installation={installation}"
    assert on_swarm.services(filters={"label": owner}) == []
    assert on_swarm.networks(filters={"label": owner}) == []


def test_a_deleted_homes_storage_endpoint_goes_at_the_next_sweep(on_swarm, tmp_path):
    """A home deleted while a job's endpoint served: the swarm would restart the endpoint's task
    for good. Any controller's sweep removes it."""
    import shutil

    from aiptrain.planning import replica_user
    from aiptrain.storage.endpoint import TLS_DIR_NAME, prepare_files

    require_image(on_swarm, runtime_image("minimal"))
    home = tmp_path / "deleted"
    (home / "gcs").mkdir(parents=True)
    prepare_files(home / TLS_DIR_NAME, home / "gcs")
    installation = uuid.uuid4().hex
    endpoint = StorageEndpoint(gcs_root=str(home / "gcs"), tls_dir=str(home / TLS_DIR_NAME), user=replica_user(),
                               installation=installation, images=(runtime_image("minimal"),))
    backend = SwarmBackend(installation, client=on_swarm, home=str(home))
    endpoint_on_a_network(on_swarm, backend, endpoint, "deleted_home")
    owner = f"aiptrain.installation={installation}"
    assert on_swarm.services(filters={"label": [owner, "aiptrain.role"]})
    shutil.rmtree(home)
    SwarmBackend(client=on_swarm).installation.remove_abandoned()
    assert on_swarm.services(filters={"label": owner}) == []
    backend.networks.remove_job_networks("deleted_home")

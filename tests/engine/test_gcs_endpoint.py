"""gs:// inside replicas, offline (AIPTRAIN_GCS=local): trainers written in the patterns of
AI Platform's published samples (paths built from --bucket, TensorFlow's GCS filesystem,
google-cloud-storage, gcsfs through pandas, gsutil and gcloud storage through subprocess) run
against the installation's storage endpoint, and what they write is plain files under
$AIPTRAIN_HOME/gcs. Also: lone replicas cannot reach each other (issue 21, item 4)."""

from __future__ import annotations

import fcntl
import subprocess
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from aiptrain.cli.gsutil import LocalGcs, run
from aiptrain.storage.endpoint import AWAIT_ENDPOINT

from conftest import job_resources, require_image, runtime_image, wait_for

RUNTIME = "2.11"


@pytest.fixture
def tf_runtime(docker_api):
    require_image(docker_api, runtime_image(RUNTIME))
    return RUNTIME


def package(tmp_path: Path, name: str, **modules: str) -> Path:
    """A trainer package `trainer` with the given modules; returns its directory."""
    root = tmp_path / name
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "__init__.py").write_text("")
    for module, source in modules.items():
        (root / "trainer" / f"{module}.py").write_text(textwrap.dedent(source))
    (root / "setup.py").write_text(f"from setuptools import setup\nsetup(name='{name}', version='0.1', "
                                   "packages=['trainer'])\n")
    return root / "trainer"


def stage(home: Path, tmp_path: Path, bucket: str, files: dict[str, str]) -> None:
    """Put the input data in the bucket as a notebook would before submitting: with gsutil (the shim's)."""
    data = tmp_path / "staged"
    for name, text in files.items():
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_text(text)
    gcs = LocalGcs(home / "gcs")
    run(gcs, "mb", [f"gs://{bucket}"])
    for name in files:
        run(gcs, "cp", [str(data / name), f"gs://{bucket}/{name}"])


def submit(cli, job_id: str, trainer: Path, *flags: str, user_args: tuple[str, ...] = (), runtime: str = RUNTIME,
           module: str = "trainer.task", stream: bool = True):
    return cli("jobs", "submit", "training", job_id, "--package-path", str(trainer), "--module-name", module,
               "--region", "us-central1", "--runtime-version", runtime, *(["--stream-logs"] if stream else []),
               *flags, "--", *user_args, timeout=600)


def linear_rows(count: int) -> str:
    return "x,y\n" + "".join(f"{x},{3 * x + 1}\n" for x in range(count))


KERAS = """
    import argparse

    import numpy as np
    import pandas as pd
    import tensorflow as tf

    parser = argparse.ArgumentParser()
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--job-dir", required=True)
    args = parser.parse_args()

    data = "gs://" + args.bucket + "/taxi"  # built here, as published trainers do: no flag names it
    files = sorted(tf.io.gfile.glob(data + "/train-*.csv"))
    print("train files", len(files))
    dataset = tf.data.experimental.make_csv_dataset(files, batch_size=8, label_name="y", num_epochs=20,
                                                    shuffle=False)
    dataset = dataset.map(lambda features, label: (tf.stack([features["x"]], axis=1), label))
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(1,))])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.1), loss="mse")
    out = args.job_dir.rstrip("/")
    model.fit(dataset, epochs=2, verbose=2, callbacks=[
        tf.keras.callbacks.ModelCheckpoint(out + "/checkpoints/ckpt-{epoch}", save_weights_only=True),
        tf.keras.callbacks.TensorBoard(out + "/logs"),
    ])
    model.save(out + "/model")
    frame = pd.read_csv(data + "/eval.csv")  # pandas reads and writes gs:// through gcsfs
    print("eval rows", len(frame))
    frame.assign(prediction=model.predict(frame[["x"]].values, verbose=0)[:, 0]).to_csv(out + "/predictions.csv")
    import gcsfs

    fs = gcsfs.GCSFileSystem()
    for index in range(3):
        fs.pipe(out + f"/scratch/{index}.txt", b"scratch")
    fs.rm(out + "/scratch", recursive=True)  # gcsfs deletes many objects in one batch request
    print("scratch left", fs.exists(out + "/scratch/0.txt"))
    again = tf.keras.models.load_model(out + "/model")
    print("reloaded prediction", float(again.predict(np.array([[1.0]]), verbose=0)[0][0]))
"""


@pytest.mark.tensorflow
def test_keras_trainer_reads_built_gs_paths_and_writes_savedmodel_checkpoints_and_events(
    cli, gcs_home, tf_runtime, tmp_path, docker_api
):
    stage(gcs_home, tmp_path, "taxi-data", {"taxi/train-0.csv": linear_rows(40), "taxi/train-1.csv": linear_rows(40),
                                             "taxi/eval.csv": linear_rows(10)})
    job_id = f"keras_gs_{uuid.uuid4().hex[:6]}"
    result = submit(cli, job_id, package(tmp_path, "keras_gs", task=KERAS),
                    "--job-dir", "gs://taxi-data/jobs/run1", user_args=("--bucket", "taxi-data"))
    assert result.returncode == 0, result.stderr[-6000:]
    assert "Running command: python3 -m trainer.task --bucket taxi-data --job-dir gs://taxi-data/jobs/run1" \
        in result.stderr  # gs:// URLs reach the trainer unchanged, as on the service
    assert "train files 2" in result.stderr and "eval rows 10" in result.stderr
    assert "reloaded prediction" in result.stderr and "scratch left False" in result.stderr
    out = gcs_home / "gcs" / "taxi-data" / "jobs" / "run1"
    assert (out / "model" / "saved_model.pb").is_file()
    assert list((out / "model" / "variables").glob("variables.data-*"))
    assert (out / "checkpoints" / "checkpoint").is_file() and (out / "checkpoints" / "ckpt-2.index").is_file()
    assert not (out / "scratch").exists()
    assert (out / "predictions.csv").read_text().startswith(",x,y,prediction\n")
    events = [p for p in (out / "logs").rglob("events.out.tfevents.*") if p.is_file()]
    assert events and all(p.stat().st_size > 0 for p in events)
    assert job_resources(docker_api, job_id) == []


XGBOOST = """
    import argparse

    import numpy as np
    import xgboost as xgb
    from google.cloud import storage

    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True)
    args = parser.parse_args()
    x = np.arange(50, dtype=float).reshape(-1, 1)
    booster = xgb.train({"max_depth": 2}, xgb.DMatrix(x, label=3 * x[:, 0] + 1), 5)
    booster.save_model("/tmp/model.bst")
    bucket, _, prefix = args.job_dir[len("gs://"):].partition("/")
    blob = storage.Client().bucket(bucket).blob(prefix + "/model.bst")
    blob.upload_from_filename("/tmp/model.bst")
    print("uploaded", blob.name, storage.Client().bucket(bucket).get_blob(blob.name).size)
"""


SKLEARN = """
    import argparse
    import os
    import subprocess

    import joblib
    import numpy as np
    from sklearn.linear_model import LinearRegression

    parser = argparse.ArgumentParser()
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--job-dir", required=True)
    args = parser.parse_args()
    subprocess.check_call(["gsutil", "cp", "gs://" + args.bucket + "/data/train.csv", "/tmp/train.csv"])
    rows = np.loadtxt("/tmp/train.csv", delimiter=",", skiprows=1)
    model = LinearRegression().fit(rows[:, :1], rows[:, 1])
    print("coefficient", round(float(model.coef_[0]), 3))
    joblib.dump(model, "/tmp/model.joblib")
    subprocess.check_call(["gsutil", "cp", "/tmp/model.joblib", args.job_dir + "/model.joblib"])
    subprocess.check_call(["gcloud", "storage", "cp", "/tmp/model.joblib", args.job_dir + "/by-gcloud/model.joblib"])
    os.makedirs("/tmp/many")
    for index in range(3):
        with open(f"/tmp/many/{index}.txt", "w") as handle:
            handle.write(f"part {index}\\n")
    subprocess.check_call(["gsutil", "-m", "cp", "-r", "/tmp/many", args.job_dir + "/"])
    subprocess.check_call(["gsutil", "rm", args.job_dir + "/many/1.txt"])
    print("listed", subprocess.check_output(["gsutil", "ls", args.job_dir + "/many"], text=True).split())
    print("cat", subprocess.check_output(["gcloud", "storage", "cat", args.job_dir + "/many/2.txt"], text=True))
    subprocess.check_call(["gcloud", "storage", "buckets", "create", "gs://made-in-a-replica"])
    subprocess.check_call(["gcloud", "storage", "rm", "--recursive", args.job_dir + "/by-gcloud"])
"""


def test_xgboost_trainer_uploads_its_model_with_google_cloud_storage(cli, gcs_home, tf_runtime, tmp_path):
    job_id = f"xgb_gs_{uuid.uuid4().hex[:6]}"
    result = submit(cli, job_id, package(tmp_path, "xgb_gs", task=XGBOOST), "--job-dir", "gs://xgb-out/run")
    assert result.returncode == 0, result.stderr[-6000:]
    model = gcs_home / "gcs" / "xgb-out" / "run" / "model.bst"
    assert model.is_file() and f"uploaded run/model.bst {model.stat().st_size}" in result.stderr


def test_sklearn_trainer_runs_gsutil_and_gcloud_storage_through_subprocess(cli, gcs_home, tf_runtime, tmp_path):
    stage(gcs_home, tmp_path, "sk-data", {"data/train.csv": linear_rows(20)})
    job_id = f"sk_gs_{uuid.uuid4().hex[:6]}"
    result = submit(cli, job_id, package(tmp_path, "sk_gs", task=SKLEARN), "--job-dir", "gs://sk-data/out",
                    user_args=("--bucket", "sk-data"))
    assert_the_sklearn_trainer_used_the_tools(result, gcs_home)


def assert_the_sklearn_trainer_used_the_tools(result, gcs_home: Path) -> None:
    """What SKLEARN leaves when gsutil and gcloud storage worked in its replica."""
    assert result.returncode == 0, result.stderr[-6000:]
    assert "coefficient 3.0" in result.stderr
    out = gcs_home / "gcs" / "sk-data" / "out"
    assert (out / "model.joblib").is_file()
    assert sorted(p.name for p in (out / "many").iterdir()) == ["0.txt", "2.txt"]
    assert "listed ['gs://sk-data/out/many/0.txt', 'gs://sk-data/out/many/2.txt']" in result.stderr
    assert "cat part 2" in result.stderr
    assert not (out / "by-gcloud").exists()
    assert (gcs_home / "gcs" / "made-in-a-replica").is_dir()


PROBE = """
    import ssl
    import urllib.request

    # No Google client here (the minimal runtime): a plain HTTPS GET, trusting the installation's CA,
    # with the job's credential (as TensorFlow's GCS file system sends it).
    request = urllib.request.Request("https://storage.googleapis.com/probe-data/hello.txt", headers={
        "Authorization": "Bearer " + __import__("os").environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"]})
    print("read", urllib.request.urlopen(request, context=ssl.create_default_context(), timeout=20).read().decode().strip())
"""


def test_every_replica_of_a_first_job_starts_before_the_endpoint_serves_and_then_reaches_gs(
    cli, gcs_home, minimal_runtime, tmp_path, docker_api
):
    """A first job's replicas are started while the storage endpoint starts (held back here by
    holding the home's lock it is started under); each trainer runs once the endpoint serves, and
    its first request, at once, reads gs://."""
    stage(gcs_home, tmp_path, "probe-data", {"hello.txt": "hello from the host\n"})
    job_id = f"multi_gs_{uuid.uuid4().hex[:6]}"
    submitted: dict[str, subprocess.CompletedProcess] = {}

    def submit_job() -> None:
        submitted["result"] = submit(
            cli, job_id, package(tmp_path, "probe", task=PROBE), "--scale-tier", "custom", "--master-machine-type",
            "n1-standard-4", "--worker-machine-type", "n1-standard-4", "--worker-count", "1",
            runtime=minimal_runtime)

    def both_running() -> list[dict]:
        running = docker_api.containers(filters={"label": f"aiptrain.job-id={job_id}", "status": "running"})
        return running if len(running) == 2 else []

    with open(gcs_home / ".storage-endpoint.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        submitting = threading.Thread(target=submit_job)
        submitting.start()
        for replica in wait_for(both_running, timeout=120, what="both replicas to run, before the endpoint"):
            assert f"{AWAIT_ENDPOINT}=storage.googleapis.com:443" in docker_api.inspect_container(replica)["Config"]["Env"]
        time.sleep(1)
        assert all("read" not in docker_api.logs(replica).decode() for replica in both_running())
    submitting.join(300)
    result = submitted["result"]
    assert result.returncode == 0, result.stderr[-4000:]
    for task in ("master-replica-0", "worker-replica-0"):
        assert f"{task}\t\tread hello from the host\n" in result.stderr, result.stderr[-3000:]
    assert job_resources(docker_api, job_id) == []


LISTEN = """
    import socket
    import time

    server = socket.socket()
    server.bind(("0.0.0.0", 7000))
    server.listen()
    print("listening", flush=True)
    server.settimeout(120)
    try:
        server.accept()
        print("ACCEPTED A CONNECTION", flush=True)
    except socket.timeout:
        pass
"""

CONNECT = """
    import socket
    import sys

    try:
        socket.create_connection((sys.argv[1], 7000), timeout=3)
        print("CONNECTED to the other job")
    except OSError as exc:
        print("could not connect:", type(exc).__name__)
"""


def test_a_lone_replica_cannot_reach_another_jobs_replica_by_ip(cli, gcs_home, minimal_runtime, tmp_path, docker_api):
    trainer = package(tmp_path, "net", listen=LISTEN, connect=CONNECT)
    listener = f"listen_{uuid.uuid4().hex[:6]}"
    started = submit(cli, listener, trainer, runtime=minimal_runtime, module="trainer.listen", stream=False)
    assert started.returncode == 0, started.stderr
    try:
        def address() -> str | None:
            for container in docker_api.containers(filters={"label": f"aiptrain.job-id={listener}"}):
                mode = container["HostConfig"]["NetworkMode"]
                if mode.startswith("container:"):  # in a network made ready for it: the holder's address
                    container = docker_api.inspect_container(mode.removeprefix("container:"))
                networks = container["NetworkSettings"]["Networks"]
                return next((n["IPAddress"] for n in networks.values() if n.get("IPAddress")), None)
            return None

        ip = wait_for(address, timeout=60, what="the listener's address")
        wait_for(lambda: _listening(docker_api, listener), timeout=60, what="the listener to listen")
        result = submit(cli, f"connect_{uuid.uuid4().hex[:6]}", trainer, runtime=minimal_runtime,
                        module="trainer.connect", user_args=(ip,))
        assert result.returncode == 0, result.stderr
        assert "could not connect:" in result.stderr and "CONNECTED" not in result.stderr, result.stderr
    finally:
        cli("jobs", "cancel", listener)
        wait_for(lambda: job_resources(docker_api, listener) == [], timeout=60, what="the listener to go")


def _listening(docker_api, job_id: str) -> bool:
    for container in docker_api.containers(filters={"label": f"aiptrain.job-id={job_id}"}):
        if b"listening" in docker_api.logs(container["Id"]):
            return True
    return False


def test_the_endpoint_and_the_lone_network_are_one_per_installation_never_outlive_its_jobs_and_go_with_the_home(
    cli, gcs_home, minimal_runtime, tmp_path, docker_api
):
    from aiptrain.backends.docker import DockerBackend
    from aiptrain.settings import Settings

    stage(gcs_home, tmp_path, "probe-data", {"hello.txt": "hello from the host\n"})
    trainer = package(tmp_path, "probe", task=PROBE)
    settings = Settings()
    owner = f"aiptrain.installation={settings.installation_id}"

    def endpoints() -> list[dict]:
        return docker_api.containers(all=True, filters={"label": [owner, "aiptrain.role=storage-endpoint"]})

    def shared() -> list[dict]:  # the endpoint and the lone replicas' network
        return endpoints() + docker_api.networks(filters={"label": [owner, "aiptrain.role"]})

    def released() -> bool:  # the controller takes them down when it goes, idle (2 s here)
        deadline = time.monotonic() + 60
        while shared() and time.monotonic() < deadline:
            time.sleep(0.2)
        return shared() == []

    for attempt in range(2):  # the second job makes them again
        result = submit(cli, f"probe{attempt}_{uuid.uuid4().hex[:6]}", trainer, runtime=minimal_runtime)
        assert result.returncode == 0 and "read hello from the host" in result.stderr, result.stderr[-3000:]
        assert released(), shared()
    DockerBackend(settings.installation_id, client=docker_api).installation.remove_installation()
    assert endpoints() == []
    assert docker_api.networks(filters={"label": [owner, "aiptrain.role"]}) == []


def test_replicas_are_told_gs_urls_unchanged_with_the_endpoint_in_the_plan(cli, gcs_home, minimal_runtime, tmp_path):
    trainer = package(tmp_path, "probe", task=PROBE)
    result = cli("jobs", "submit", "training", "plan_only", "--package-path", str(trainer), "--module-name",
                 "trainer.task", "--job-dir", "gs://my-bucket/jobs/x", "--runtime-version", minimal_runtime,
                 "--dry-run", "--", "--data", "gs://my-bucket/data/train.csv")
    assert result.returncode == 0, result.stderr
    [master] = yaml.safe_load(result.stdout)["containers"]
    assert master["command"][-4:] == ["--data", "gs://my-bucket/data/train.csv", "--job-dir", "gs://my-bucket/jobs/x"]
    env = master["env"]
    assert env["CLOUD_STORAGE_EMULATOR_ENDPOINT"] == "https://storage.googleapis.com" and env["NO_GCE_CHECK"] == "true"
    assert "STORAGE_EMULATOR_HOST" not in env  # google-cloud-storage would send no credential
    assert env["GOOGLE_CLOUD_PROJECT"] == "aiptrain" and env["GOOGLE_AUTH_TOKEN_FOR_TESTING"] == "*****"
    assert env["CURL_CA_BUNDLE"] == env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == "/opt/aiptrain/storage/trust.pem"
    assert env["PATH"].startswith("/opt/aiptrain/bin:")
    assert all(m["read_only"] for m in master["mounts"] if "gcs" in m["source"] or "storage" in m["source"])
    assert not any(m["target"].startswith(str(gcs_home)) for m in master["mounts"])  # no bucket is bind-mounted
    assert not (gcs_home / "storage-endpoint").exists()  # a dry run creates nothing


@pytest.mark.tensorflow
def test_a_study_with_a_gs_job_dir_reads_its_trials_summaries_from_the_kept_files(
    cli, gcs_home, tf_runtime, tmp_path, monkeypatch
):
    """Trials write tf.summary events to gs://.../<trialId> through the endpoint; the study reads
    each finalMetric from those files on the host (issue 16 item 5 with gs:// kept locally)."""
    assert_a_gs_study_reads_every_trials_metric(cli, gcs_home, tmp_path, monkeypatch, tf_runtime)


def assert_a_gs_study_reads_every_trials_metric(cli, gcs_home: Path, tmp_path: Path, monkeypatch, runtime: str, *flags: str) -> None:
    """The study above, submitted with `flags` (a backend); asserts it read every trial's metric."""
    monkeypatch.setenv("AIPTRAIN_POLL_SECONDS", "0.2")
    spec = {"algorithm": "GRID_SEARCH", "maxTrials": 2, "maxParallelTrials": 2, "hyperparameterMetricTag": "epoch_accuracy",
            "params": [{"parameterName": "lr", "type": "DISCRETE", "discreteValues": [0.1, 0.2]}]}
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": spec}}))
    trainer = Path(__file__).parents[1] / "trainers" / "summary_tuner"
    result = cli("jobs", "submit", "training", "gs_study", "--config", str(config), "--package-path", str(trainer),
                 "--module-name", "summary_tuner.task", "--job-dir", "gs://study-out/run", "--region", "us-central1",
                 "--runtime-version", runtime, "--stream-logs", *flags, "--", "--epochs", "1", timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    job = yaml.safe_load(cli("jobs", "describe", "gs_study", check_code=0).stdout)
    trials = job["trainingOutput"]["trials"]
    assert sorted(t["finalMetric"]["objectiveValue"] for t in trials) == pytest.approx([0.1, 0.2])
    for trial in trials:
        assert list((gcs_home / "gcs" / "study-out" / "run" / trial["trialId"] / "validation").iterdir())


def test_what_a_deleted_home_shared_goes_at_the_next_sweep_or_when_the_subnet_pool_runs_out(tmp_path, docker_api):
    """A home deleted while no controller of its ran leaves its lone replicas' network (a /22 of
    the pool each): any controller's sweep removes it, and so does a network create that would
    otherwise find the pool full. A home that still exists keeps its network."""
    import shutil

    from aiptrain.backends.docker import DockerBackend
    from aiptrain.settings import Settings

    pool = "10.213.4.0/22"  # room for exactly one lone replicas' network

    def backend(name: str, subnet_pool: str = "10.213.8.0/21") -> DockerBackend:
        home = tmp_path / name
        home.mkdir(exist_ok=True)
        return DockerBackend(Settings(home=home).installation_id, client=docker_api, subnet_pool=subnet_pool,
                             home=str(home))

    def homes_with_networks() -> set[str]:
        return {n["Labels"].get("aiptrain.home") for n in docker_api.networks(filters={"label": "aiptrain.home"})}

    backend("gone").networks.solo_network()
    kept = backend("kept")
    kept.networks.solo_network()
    shutil.rmtree(tmp_path / "gone")
    backend("sweeper").installation.remove_abandoned()
    assert str(tmp_path / "gone") not in homes_with_networks() and str(tmp_path / "kept") in homes_with_networks()

    backend("gone_too", pool).networks.solo_network()
    shutil.rmtree(tmp_path / "gone_too")
    newcomer = backend("newcomer", pool)
    newcomer.networks.solo_network()  # the pool's one /22 was the deleted home's
    assert str(tmp_path / "gone_too") not in homes_with_networks() and str(tmp_path / "newcomer") in homes_with_networks()
    for remaining in (kept, newcomer):
        remaining.installation.remove_installation()


def test_a_deleted_homes_exited_replicas_and_their_network_are_swept_and_running_ones_stay(tmp_path, docker_api):
    """What a job of a home deleted under it left (the benchmarks' interrupted runs did): its
    replicas once they have exited, then its network. A replica still running is a trainer's
    work: it stays, and so does the network it is on."""
    import contextlib
    import shutil

    from docker.errors import NotFound

    from aiptrain.backends.docker import DockerBackend
    from aiptrain.planning import NetworkSpec
    from aiptrain.settings import Settings

    home = tmp_path / "deleted"
    home.mkdir()
    backend = DockerBackend(Settings(home=home).installation_id, client=docker_api, subnet_pool="10.213.16.0/21",
                            home=str(home))
    names = {"done": f"aiptrain-sweep-done-{tmp_path.name}"[:60], "busy": f"aiptrain-sweep-busy-{tmp_path.name}"[:60]}
    networks = {role: f"{name}-net" for role, name in names.items()}
    for role in names:
        backend.networks.create(NetworkSpec(networks[role], {"aiptrain.job-id": role}))
    labels = {"aiptrain.home": str(home)}  # as Engine.create labels a replica
    docker_api.start(docker_api.create_container(
        "aiptrain/runtime:minimal", command=["true"], labels=labels, name=names["done"],
        host_config=docker_api.create_host_config(network_mode=networks["done"]))["Id"])
    docker_api.start(docker_api.create_container(
        "aiptrain/runtime:minimal", command=["sleep", "60"], labels=labels, name=names["busy"],
        host_config=docker_api.create_host_config(network_mode=networks["busy"]))["Id"])
    try:
        docker_api.wait(names["done"], timeout=30)
        assert {n["Labels"].get("aiptrain.home") for n in docker_api.networks(names=list(networks.values()))} == {
            str(home)}
        shutil.rmtree(home)
        DockerBackend(client=docker_api).installation.remove_abandoned()

        left = {c["Names"][0].lstrip("/") for c in docker_api.containers(all=True, filters={"label": "aiptrain.home"})}
        assert names["done"] not in left and names["busy"] in left
        kept = {n["Name"] for n in docker_api.networks(names=list(networks.values()))}
        assert kept == {networks["busy"]}
    finally:
        for name in names.values():
            with contextlib.suppress(NotFound):
                docker_api.remove_container(name, force=True)
        for network in docker_api.networks(names=list(networks.values())):
            docker_api.remove_network(network["Id"])


def test_the_sweep_removes_the_networks_the_engine_kept_after_this_homes_jobs_ended(tmp_path, docker_api):
    """A teardown that met a network the engine kept (a stale endpoint) ends the job all the same;
    the controller's sweep then removes the network once the engine lets it go: a network of this
    home's ended job goes, an active job's stays, and so does one a container is still on and
    another home's."""
    import contextlib

    from docker.errors import NotFound

    from aiptrain.backends.docker import DockerBackend
    from aiptrain.planning import NetworkSpec
    from aiptrain.settings import Settings

    def backend(name: str) -> DockerBackend:
        home = tmp_path / name
        home.mkdir(exist_ok=True)
        return DockerBackend(Settings(home=home).installation_id, client=docker_api, subnet_pool="10.213.24.0/21",
                             home=str(home))

    ours, theirs = backend("ours"), backend("theirs")
    prefix = f"aiptrain-kept-{tmp_path.name}"[:50]
    jobs = {"ended": ours, "active": ours, "busy": ours, "theirs": theirs}
    for job_id, owner in jobs.items():
        owner.networks.create(NetworkSpec(f"{prefix}-{job_id}", {"aiptrain.job-id": job_id,
                                                                 "aiptrain.installation": owner.engine.installation}))
    busy = docker_api.create_container("aiptrain/runtime:minimal", command=["sleep", "60"],
                                       host_config=docker_api.create_host_config(network_mode=f"{prefix}-busy"))["Id"]
    docker_api.start(busy)
    asked = []
    try:
        ours.installation.remove_abandoned(lambda: asked.append(True) or {"active"})
        assert asked == [True]
        left = {n["Name"] for n in docker_api.networks(filters={"label": "aiptrain.job-id"}) if n["Name"].startswith(prefix)}
        assert left == {f"{prefix}-active", f"{prefix}-busy", f"{prefix}-theirs"}
    finally:
        with contextlib.suppress(NotFound):
            docker_api.remove_container(busy, force=True)
        for network in docker_api.networks(filters={"label": "aiptrain.job-id"}):
            if network["Name"].startswith(prefix):
                docker_api.remove_network(network["Id"])

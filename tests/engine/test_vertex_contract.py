"""Vertex AI's replica contract, checked from inside real replicas: CustomJobs created by the
real SDK (`google-cloud-aiplatform` over REST, anonymous) against `aiptrain serve` on a free
loopback port, gs:// kept on this machine. The trainers are written the way Google's samples
are (they read TF_CONFIG, CLUSTER_SPEC, MASTER_ADDR/RANK, AIP_MODEL_DIR, and turn gs://B/x into
/gcs/B/x); each writes what it saw under /gcs, and the tests assert on that, on what reached the
bucket (read back with google-cloud-storage through the server), and on the job as the SDK sees
it. Then the `scheduling` fields: timeout, FLEX_START's wait and restartJobOnWorkerRestart."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from aiptrain.packaging import build_sdist
from aiptrain.settings import Settings

from conftest import job_resources, require_image, runtime_image
from test_pytorch_ddp import torch_image as torch_image  # a fixture
from test_real_gcloud import serving

PROJECT = "vertex-contract"
LOCATION = "us-central1"
MINIMAL, TF = runtime_image("minimal"), runtime_image("2.11")
SKLEARN_EXECUTOR = "us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-0:latest"


def sdk(url: str, project: str = PROJECT, credentials=None):
    """The SDK pointed at the server, as a user points it at a regional endpoint."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform

    aiplatform.init(project=project, location=LOCATION, api_endpoint=url, api_transport="rest",
                    credentials=credentials or AnonymousCredentials(), staging_bucket=f"gs://{project}-b/staging")
    return aiplatform


def storage_client(project: str = PROJECT, credentials=None):
    """google-cloud-storage as a user's process has it with STORAGE_EMULATOR_HOST set (the fixture sets it)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project=project, credentials=credentials or AnonymousCredentials())


def staged_trainer(tmp_path: Path, task_source: str):
    """A `trainer` package of one task module, as an sdist in the project's bucket `{PROJECT}-b`
    (made here): (the bucket, the package's gs:// URI)."""
    source = tmp_path / "trainer-src" / "trainer"
    source.mkdir(parents=True)
    (source / "__init__.py").write_text("")
    (source / "task.py").write_text(task_source)
    (tmp_path / "dist").mkdir()
    sdist = build_sdist(source, tmp_path / "dist")
    bucket = storage_client().create_bucket(f"{PROJECT}-b")
    bucket.blob(f"packages/{sdist.path.name}").upload_from_filename(str(sdist.path))
    return bucket, f"gs://{PROJECT}-b/packages/{sdist.path.name}"


@pytest.fixture
def server(gcs_home, monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", PROJECT)
    with serving() as url:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
        yield url


def pool(image: str, code: str, count: int = 1, args: tuple[str, ...] = (), env: dict | None = None) -> dict:
    """A worker pool whose replicas run `code` with `python3 -c` (a trainer's task.py, inline)."""
    spec = {"image_uri": image, "command": ["python3", "-c", textwrap.dedent(code)], "args": list(args)}
    if env:
        spec["env"] = [{"name": name, "value": value} for name, value in env.items()]
    return {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": count, "container_spec": spec}


def seen(project_bucket: str, folder: str) -> dict[str, dict]:
    """What each replica wrote under /gcs/BUCKET/FOLDER/<name>.json, by name (read on the host)."""
    root = Settings().gcs_root / project_bucket / folder
    return {path.stem: json.loads(path.read_text()) for path in sorted(root.glob("*.json"))}


def job_key(job) -> str:
    """The key of the ml v1 job that ran a CustomJob (its replicas' label)."""
    from aiptrain.store import JobStore
    from aiptrain.vertex.records import CUSTOM_JOBS, VertexRecords

    with JobStore(Settings().store_path) as store:
        record = VertexRecords(store).get(job.project, CUSTOM_JOBS, job.name)
    assert record is not None and record.job_key
    return record.job_key


# Every replica: what Vertex AI told it, written where the primary (and the test) can read it.
REPORT = """
    import json, os

    def report(folder, **extra):
        spec = json.loads(os.environ["CLUSTER_SPEC"])
        task = spec["task"]
        bucket = os.environ["AIP_MODEL_DIR"][len("gs://"):].split("/", 1)[0]
        directory = f"/gcs/{bucket}/{folder}"
        os.makedirs(directory, exist_ok=True)
        names = ("TF_CONFIG", "CLUSTER_SPEC", "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR",
                 "CLOUD_ML_JOB_ID", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "POOL_ENV")
        seen = {"env": {name: os.environ.get(name) for name in names}, "gcs": sorted(os.listdir("/gcs")), **extra}
        with open(f"{directory}/{task['type']}-{task['index']}.json", "w") as handle:
            json.dump(seen, handle)
        return task
"""


def check_cluster_spec(seen_by: dict[str, dict], pools: dict[str, int], job_id: str) -> None:
    """CLUSTER_SPEC as Vertex AI gives it, the same cluster on every replica, and the variables."""
    clusters = []
    for name, replica in seen_by.items():
        spec = json.loads(replica["env"]["CLUSTER_SPEC"])
        pool_name, index = name.rsplit("-", 1)
        assert spec["task"] == {"type": pool_name, "index": int(index)}, spec
        assert spec["environment"] == "cloud"
        assert isinstance(spec["job"], str) and json.loads(spec["job"])["worker_pool_specs"]
        assert {key: len(hosts) for key, hosts in spec["cluster"].items()} == pools
        clusters.append(spec["cluster"])
        env = replica["env"]
        assert env["CLOUD_ML_JOB_ID"] == job_id
        for variable, below in (("AIP_MODEL_DIR", "model/"), ("AIP_CHECKPOINT_DIR", "checkpoints/"),
                                ("AIP_TENSORBOARD_LOG_DIR", "logs/")):
            assert env[variable] == f"gs://{PROJECT}-b/out/{below}"
    assert all(cluster == clusters[0] for cluster in clusters)
    assert sorted(seen_by) == sorted(f"{key}-{i}" for key, count in pools.items() for i in range(count))


# -- TensorFlow: Keras MultiWorkerMirroredStrategy -------------------------------------------------

KERAS_MWMS = REPORT + """
    import sys, tempfile
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    task = report("seen")
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # reads TF_CONFIG
    task_type, task_id = strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id
    x = tf.random.stateless_uniform([256, 1], seed=[1, 2])
    dataset = tf.data.Dataset.from_tensor_slices((x, 3 * x + 1)).repeat().batch(16)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(1,))])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    model.fit(dataset, epochs=1, steps_per_epoch=int(sys.argv[1]), verbose=2)
    # Google's sample: the chief saves to AIP_MODEL_DIR, the others to a directory of their own.
    chief = task_type == "chief"
    model.save(os.environ["AIP_MODEL_DIR"] if chief else tempfile.mkdtemp(prefix=f"workertemp_{task_id}_"))
    print(f"{task_type} {task_id} ({task['type']}): saved", flush=True)
"""


@pytest.mark.tensorflow
def test_keras_multi_worker_mirrored_reads_tf_config_and_saves_to_aip_model_dir(server, docker_api):
    require_image(docker_api, TF)
    aiplatform = sdk(server)
    job = aiplatform.CustomJob(
        display_name="keras-mwms",
        worker_pool_specs=[pool(TF, KERAS_MWMS, args=("3",)), pool(TF, KERAS_MWMS, args=("3",))],
        base_output_dir=f"gs://{PROJECT}-b/out",
    )
    job.run(sync=True)
    assert job.state.name == "JOB_STATE_SUCCEEDED"
    seen_by = seen(f"{PROJECT}-b", "seen")
    check_cluster_spec(seen_by, {"workerpool0": 1, "workerpool1": 1}, job.name)
    chief = json.loads(seen_by["workerpool0-0"]["env"]["TF_CONFIG"])
    worker = json.loads(seen_by["workerpool1-0"]["env"]["TF_CONFIG"])
    assert chief["task"] == {"type": "chief", "index": 0} and worker["task"] == {"type": "worker", "index": 0}
    assert chief["cluster"] == worker["cluster"] and sorted(chief["cluster"]) == ["chief", "worker"]
    objects = {blob.name for blob in storage_client().list_blobs(f"{PROJECT}-b", prefix="out/model/")}
    assert "out/model/saved_model.pb" in objects, objects
    assert job_resources(docker_api, job_key(job)) == []


# -- PyTorch DDP (gloo on CPU) -------------------------------------------------------------------

TORCH_DDP = REPORT + """
    import torch
    import torch.distributed as dist

    spec = json.loads(os.environ["CLUSTER_SPEC"])
    task = spec["task"]
    rank = 0 if task["type"] == "workerpool0" else 1 + task["index"]  # Google's samples' rule
    dist.init_process_group("gloo")  # MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK
    total = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(total)
    report("ddp", rank=dist.get_rank(), world=dist.get_world_size(), spec_rank=rank, total=total.item())
    dist.barrier()
    dist.destroy_process_group()
"""


def test_pytorch_ddp_finds_its_group_from_master_addr_and_rank(server, docker_api, torch_image):
    aiplatform = sdk(server)
    job = aiplatform.CustomJob(
        display_name="torch-ddp",
        worker_pool_specs=[pool(torch_image, TORCH_DDP), pool(torch_image, TORCH_DDP, count=2)],
        base_output_dir=f"gs://{PROJECT}-b/out",
    )
    job.run(sync=True)
    assert job.state.name == "JOB_STATE_SUCCEEDED"
    seen_by = seen(f"{PROJECT}-b", "ddp")
    check_cluster_spec(seen_by, {"workerpool0": 1, "workerpool1": 2}, job.name)
    for name, replica in seen_by.items():
        env = replica["env"]
        assert replica["world"] == int(env["WORLD_SIZE"]) == 3 and replica["total"] == 1 + 2 + 3
        assert replica["rank"] == int(env["RANK"]) == replica["spec_rank"], (name, replica)
        primary = json.loads(env["CLUSTER_SPEC"])["cluster"]["workerpool0"][0]
        assert f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" == primary


# -- scikit-learn through /gcs, a pythonPackageSpec on a prebuilt executor image ---------------------

SKLEARN_TASK = '''\
"""Google's scikit-learn sample, shortened: data and model through the Cloud Storage FUSE mount."""
import argparse
import csv
import json
import os

import joblib
from sklearn.linear_model import LogisticRegression


def gcs_path(uri):
    return uri.replace("gs://", "/gcs/", 1)


parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
args = parser.parse_args()
with open(gcs_path(args.data)) as handle:
    rows = [[float(value) for value in row] for row in csv.reader(handle)]
model = LogisticRegression().fit([row[:-1] for row in rows], [int(row[-1]) for row in rows])
model_dir = gcs_path(os.environ["AIP_MODEL_DIR"])
os.makedirs(model_dir, exist_ok=True)
joblib.dump(model, os.path.join(model_dir, "model.joblib"))
with open(os.path.join(model_dir, "seen.json"), "w") as handle:
    json.dump({"score": model.score([row[:-1] for row in rows], [int(row[-1]) for row in rows]),
               "pool_env": os.environ.get("POOL_ENV"), "job": os.environ.get("CLOUD_ML_JOB_ID")}, handle)
'''


def test_scikit_learn_reads_data_and_writes_its_model_through_gcs(server, docker_api, tmp_path):
    require_image(docker_api, TF)  # the sklearn-cpu.1-0 executor runs on runtime 2.11
    bucket, package = staged_trainer(tmp_path, SKLEARN_TASK)
    rows = [f"{x / 10},{(x % 7) / 7},{int(x > 10)}" for x in range(20)]
    bucket.blob("data/train.csv").upload_from_string("\n".join(rows) + "\n")

    aiplatform = sdk(server)
    job = aiplatform.CustomJob(
        display_name="sklearn",
        worker_pool_specs=[{
            "machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
            "python_package_spec": {"executor_image_uri": SKLEARN_EXECUTOR,
                                    "package_uris": [package],
                                    "python_module": "trainer.task", "args": [f"--data=gs://{PROJECT}-b/data/train.csv"],
                                    "env": [{"name": "POOL_ENV", "value": "pool0"}]},
        }],
        base_output_dir=f"gs://{PROJECT}-b/out",
    )
    job.run(sync=True)
    assert job.state.name == "JOB_STATE_SUCCEEDED"
    model = bucket.get_blob("out/model/model.joblib")
    assert model is not None and model.size > 100
    said = json.loads(bucket.blob("out/model/seen.json").download_as_bytes())
    assert said == {"score": said["score"], "pool_env": "pool0", "job": job.name} and said["score"] > 0.7


# -- parameter servers and evaluators; one project's buckets only -------------------------------------

POOLS = REPORT + """
    import sys, time
    task = report("pools")
    if task["type"] == "workerpool0":  # the primary ends the job once every replica has said what it saw
        folder = os.path.dirname(os.environ["AIP_MODEL_DIR"].replace("gs://", "/gcs/", 1).rstrip("/"))
        deadline = time.time() + 120
        while len(os.listdir(f"/gcs/{folder.split('/')[2]}/pools")) < int(sys.argv[1]) and time.time() < deadline:
            time.sleep(0.2)
    elif task["type"] != "workerpool3":  # an evaluator ends on its own (it has a grace period to)
        time.sleep(3600)  # parameter servers never end on their own; the primary's end stops them
"""


def test_parameter_server_and_evaluator_pools_are_ps_and_evaluator(server, docker_api):
    require_image(docker_api, MINIMAL)
    aiplatform = sdk(server)
    job = aiplatform.CustomJob(
        display_name="pools",
        worker_pool_specs=[pool(MINIMAL, POOLS, args=("5",)), pool(MINIMAL, POOLS, count=2),
                           pool(MINIMAL, POOLS, env={"POOL_ENV": "ps"}), pool(MINIMAL, POOLS)],
        base_output_dir=f"gs://{PROJECT}-b/out",
    )
    job.run(sync=True)
    assert job.state.name == "JOB_STATE_SUCCEEDED"
    seen_by = seen(f"{PROJECT}-b", "pools")
    check_cluster_spec(seen_by, {"workerpool0": 1, "workerpool1": 2, "workerpool2": 1, "workerpool3": 1}, job.name)
    types = {name: json.loads(replica["env"]["TF_CONFIG"])["task"] for name, replica in seen_by.items()}
    assert types == {"workerpool0-0": {"type": "chief", "index": 0}, "workerpool1-0": {"type": "worker", "index": 0},
                     "workerpool1-1": {"type": "worker", "index": 1}, "workerpool2-0": {"type": "ps", "index": 0},
                     "workerpool3-0": {"type": "evaluator", "index": 0}}
    cluster = json.loads(seen_by["workerpool0-0"]["env"]["TF_CONFIG"])["cluster"]
    assert sorted(cluster) == ["chief", "ps", "worker"]  # evaluators are not part of the training cluster
    assert {name: replica["env"]["POOL_ENV"] for name, replica in seen_by.items()} == {
        "workerpool0-0": None, "workerpool1-0": None, "workerpool1-1": None, "workerpool2-0": "ps",
        "workerpool3-0": None}


TEAM_A, TEAM_B = "a" * 24, "b" * 24
TOKENS = [{"name": "team-a", "token": TEAM_A, "projects": ["team-a"]},
          {"name": "team-b", "token": TEAM_B, "projects": ["team-b"]}]
LOOK_AROUND = """
    import json, os
    found = {"gcs": sorted(os.listdir("/gcs"))}
    for path in ("/gcs/team-b-data/secret.txt", "/gcs/team-a-b/out/mine.txt"):
        try:
            with open(path) as handle:
                found[path] = handle.read()
        except OSError as exc:
            found[path] = type(exc).__name__
    os.makedirs("/gcs/team-a-b/out", exist_ok=True)
    with open("/gcs/team-a-b/out/mine.txt", "w") as handle:
        handle.write("team-a's output")
    print("FOUND", json.dumps(found), flush=True)
    with open("/gcs/team-a-b/found.json", "w") as handle:
        json.dump(found, handle)
"""


def test_a_replica_sees_only_its_own_projects_buckets_under_gcs(gcs_home, docker_api, tmp_path):
    from google.oauth2.credentials import Credentials

    from aiptrain.api.access import load_tokens
    from aiptrain.storage.endpoint_server import Tree

    require_image(docker_api, MINIMAL)
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    Tree(str(Settings().gcs_root)).mark_team()  # what `aiptrain serve --tokens` does at its start
    with serving(load_tokens(tokens)) as url:
        from google.cloud import storage

        theirs = storage.Client(project="team-b", credentials=Credentials(TEAM_B),
                                client_options={"api_endpoint": url}).create_bucket("team-b-data")
        theirs.blob("secret.txt").upload_from_string(b"team-b's secret")
        aiplatform = sdk(url, project="team-a", credentials=Credentials(TEAM_A))
        job = aiplatform.CustomJob(display_name="look-around", worker_pool_specs=[pool(MINIMAL, LOOK_AROUND)],
                                   base_output_dir="gs://team-a-b/out")
        job.run(sync=True)
        assert job.state.name == "JOB_STATE_SUCCEEDED"
    found = json.loads((Settings().gcs_root / "team-a-b" / "found.json").read_text())
    assert found == {"gcs": ["team-a-b"], "/gcs/team-b-data/secret.txt": "FileNotFoundError",
                     "/gcs/team-a-b/out/mine.txt": "FileNotFoundError"}
    assert (Settings().gcs_root / "team-a-b" / "out" / "mine.txt").read_text() == "team-a's output"
    assert (Settings().gcs_root / "team-b-data" / "secret.txt").read_text() == "team-b's secret"


# -- scheduling ----------------------------------------------------------------------------------------

SLEEPER = "import time; time.sleep(3600)"
RESTARTER = REPORT + """
    import signal, sys, time
    task = report("restart")
    bucket = os.environ["AIP_MODEL_DIR"][len("gs://"):].split("/", 1)[0]
    starts = f"/gcs/{bucket}/starts"
    os.makedirs(starts, exist_ok=True)
    mine = f"{starts}/{task['type']}-{task['index']}"
    with open(mine, "a") as handle:
        handle.write("started\\n")
    runs = open(mine).read().count("started")
    print(f"{task['type']}-{task['index']}: run {runs}", flush=True)
    if task["type"] == "workerpool1" and runs == 1:
        time.sleep(2)
        os.kill(os.getpid(), signal.SIGKILL)  # killed, as a preempted replica is: the job starts over
    def worker_runs():
        try:
            return open(f"{starts}/workerpool1-0").read().count("started")
        except FileNotFoundError:
            return 0

    if task["type"] == "workerpool0":
        deadline = time.time() + 120  # the primary ends the job once the worker is back
        while worker_runs() < 2 and time.time() < deadline:
            time.sleep(0.2)
    else:
        time.sleep(3600)
"""


def test_a_worker_restarted_restarts_the_whole_job_when_it_asks(server, docker_api):
    require_image(docker_api, MINIMAL)
    aiplatform = sdk(server)
    job = aiplatform.CustomJob(display_name="restart-together",
                               worker_pool_specs=[pool(MINIMAL, RESTARTER), pool(MINIMAL, RESTARTER)],
                               base_output_dir=f"gs://{PROJECT}-b/out")
    job.run(sync=True, restart_job_on_worker_restart=True)
    assert job.state.name == "JOB_STATE_SUCCEEDED"
    starts = Settings().gcs_root / f"{PROJECT}-b" / "starts"
    # The primary started over with the worker: twice each.
    assert (starts / "workerpool0-0").read_text().count("started") == 2
    assert (starts / "workerpool1-0").read_text().count("started") == 2


def test_a_job_past_its_timeout_fails_and_one_past_its_flex_start_wait_fails(gcs_home, docker_api, monkeypatch):
    """One replica may run at a time: the sleeper holds the slot until its timeout ends it, and a
    FLEX_START job behind it waits for room at most its maxWaitDuration."""
    from google.cloud.aiplatform_v1.types import custom_job as custom_job_types

    require_image(docker_api, MINIMAL)
    monkeypatch.setenv("AIPTRAIN_MAX_RUNNING_REPLICAS", "1")  # before the server and its controller start
    with serving() as url:
        aiplatform = sdk(url)
        sleeper = aiplatform.CustomJob(display_name="sleeper", worker_pool_specs=[pool(MINIMAL, SLEEPER)],
                                       base_output_dir=f"gs://{PROJECT}-b/out")
        sleeper.run(sync=False, timeout=20)
        sleeper.wait_for_resource_creation()
        waiter = aiplatform.CustomJob(display_name="flex", worker_pool_specs=[pool(MINIMAL, SLEEPER)],
                                      base_output_dir=f"gs://{PROJECT}-b/out")
        waiter.run(sync=False, scheduling_strategy=custom_job_types.Scheduling.Strategy.FLEX_START,
                   max_wait_duration=2)
        with pytest.raises(RuntimeError, match="did not start within scheduling.maxWaitDuration"):
            waiter.wait()
        assert waiter.state.name == "JOB_STATE_FAILED" and waiter.error.code == 4
        assert sleeper.state.name in ("JOB_STATE_RUNNING", "JOB_STATE_PENDING")  # still holding the slot
        with pytest.raises(RuntimeError, match=r"ran longer than scheduling.timeout \(20s\)"):
            sleeper.wait()
        assert sleeper.state.name == "JOB_STATE_FAILED" and sleeper.error.code == 4
        assert job_resources(docker_api, job_key(sleeper)) == []

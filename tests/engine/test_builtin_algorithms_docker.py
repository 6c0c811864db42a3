"""AI Platform's built-in algorithms on the real engine (issue 38): the service's command lines,
unchanged but for tiny step counts, run the images tagged gcr.io/cloud-ml-algos/... (built here
from the 2.11 runtime image) against gs:// kept on this machine. Each job's --job-dir is checked
file by file, its SavedModel loaded and called (its XGBoost model loaded), and its accuracy on a
separable synthetic census-like set held above a floor; through the CLI, the REST API and the real
gcloud, and a tuning study over the linear learner."""

from __future__ import annotations

import json
import random
import re
import time
import uuid
from pathlib import Path

import docker.errors
import pytest
import yaml

from aiptrain.algorithms.catalog import ALGORITHMS
from aiptrain.algorithms.images import build_image, image_is_current
from aiptrain.cli.gsutil import LocalGcs, run

from conftest import job_resources, require_image, runtime_image
from test_real_gcloud import configured_gcloud, describe, serving
from test_rest_api import PROJECT, ml_api

RUNTIME = runtime_image("2.11")
ACCURACY_FLOOR = 0.8  # the census-like set is separable: a model that learned anything is well above this


@pytest.fixture(autouse=True)
def project(monkeypatch):
    """Every job, bucket and client of these tests in one project (the REST API's and gcloud's)."""
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", PROJECT)


@pytest.fixture(scope="module")
def algorithm_images(docker_api, tmp_path_factory):
    """Every built-in algorithm's image, built from the 2.11 runtime image where not current."""
    require_image(docker_api, RUNTIME)
    cache = tmp_path_factory.mktemp("algorithm-cache")
    for algorithm in ALGORITHMS.values():
        if not image_is_current(algorithm):
            build_image(algorithm, cache)
    return ALGORITHMS


def census_rows(count: int, seed: int = 38) -> list[str]:
    """Census-like rows, target first: income class, age (float), workclass, education number (a few
    integers: categorical), hours per week (float, sometimes blank), a row ID (an instance key).
    The class is a linear rule of the features with a margin: separable."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < count:
        age, hours = rng.uniform(18, 80), rng.uniform(10, 70)
        workclass, education = rng.choice(["Private", "Self-emp", "Gov", "Never-worked"]), rng.randint(1, 16)
        score = 0.06 * (age - 45) + 0.08 * (hours - 40) + (1.5 if workclass == "Gov" else 0) + 0.15 * (education - 8)
        if abs(score) < 0.5:
            continue
        hours_text = "" if rng.random() < 0.04 else f"{hours:.2f}"
        rows.append(f"{'>50K' if score > 0 else '<=50K'},{age:.1f},{workclass},{education},{hours_text},"
                    f"{100000 + len(rows)}")
    return rows


def regression_rows(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        x1, x2, colour = rng.uniform(-1, 1), rng.uniform(-1, 1), rng.choice("abc")
        y = 3 * x1 - 2 * x2 + {"a": 0.0, "b": 1.0, "c": -1.0}[colour] + rng.gauss(0, 0.05)
        rows.append(f"{y:.4f},{x1:.4f},{x2:.4f},{colour}")
    return rows


@pytest.fixture
def bucket(gcs_home, tmp_path):
    """A bucket kept on this machine holding census.csv and regression.csv, as a notebook would upload them."""
    name = f"algos-{uuid.uuid4().hex[:8]}"
    gcs = LocalGcs(gcs_home / "gcs")
    run(gcs, "mb", [f"gs://{name}"])
    for file, rows in (("census.csv", census_rows(300)), ("regression.csv", regression_rows(200))):
        (tmp_path / file).write_text("\n".join(rows) + "\n")
        run(gcs, "cp", [str(tmp_path / file), f"gs://{name}/{file}"])
    return name


def local(gcs_home: Path, url: str) -> Path:
    return gcs_home / "gcs" / url[len("gs://"):]


def layout(directory: Path) -> list[str]:
    """The files under a job dir, event files and checkpoint numbers by their pattern."""
    names = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        name = path.relative_to(directory).as_posix()
        name = re.sub(r"events\.out\.tfevents\..*", "events.out.tfevents.*", name)
        names.append(re.sub(r"ckpt-\d+\.", "ckpt-N.", name))
    return sorted(set(names))


TENSORFLOW_LAYOUT = [
    "artifacts/metadata.json", "experiment/checkpoint", "experiment/ckpt-N.data-00000-of-00001",
    "experiment/ckpt-N.index", "experiment/eval/events.out.tfevents.*", "experiment/train/events.out.tfevents.*",
    "model/deployment_config.yaml", "model/fingerprint.pb", "model/saved_model.pb",
    "model/variables/variables.data-00000-of-00001", "model/variables/variables.index",
    "processed_data/test_data.csv", "processed_data/training_data.csv", "processed_data/validation_data.csv",
]
XGBOOST_LAYOUT = ["artifacts/metadata.json", "model/deployment_config.yaml", "model/model.bst",
                  "processed_data/test_data.csv", "processed_data/training_data.csv",
                  "processed_data/validation_data.csv"]

# Run in the runtime image on a job dir mounted at /out: the model predicts the processed test rows
# (without their target), as a prediction service would be sent them.
PREDICT_TENSORFLOW = """
import csv, json
import tensorflow as tf
rows = list(csv.reader(open('/out/processed_data/test_data.csv')))
serve = tf.saved_model.load('/out/model').signatures['serving_default']
out = serve(csv_row=tf.constant([','.join(r[1:]) for r in rows]))
key = 'classes' if 'classes' in out else 'predictions'
values = [v.decode() if isinstance(v, bytes) else float(v) for v in out[key].numpy().tolist()]
print(json.dumps({'targets': [r[0] for r in rows], 'predicted': values, 'outputs': sorted(out)}))
"""
PREDICT_XGBOOST = """
import csv, json
import numpy as np, xgboost as xgb
meta = json.load(open('/out/artifacts/metadata.json'))
booster = xgb.Booster(model_file='/out/model/model.bst')
rows = list(csv.reader(open('/out/processed_data/test_data.csv')))
def encode(row):
    numbers = []
    for column in meta['columns']:
        value = row[column['index']]
        if column['type'] == 'numerical':
            numbers.append(float(value))
        elif column['type'] == 'categorical':
            numbers += [1.0 if value == v else 0.0 for v in column['vocabulary']]
    return numbers
assert len(encode(rows[0])) == len(meta['features'])
scores = booster.predict(xgb.DMatrix(np.array([encode(r) for r in rows], dtype=np.float32)))
classes = meta['target']['classes']
print(json.dumps({'targets': [r[0] for r in rows], 'predicted': [classes[int(s > 0.5)] for s in scores],
                  'outputs': ['model.bst']}))
"""


def predict(docker_api, job_dir: Path, script: str) -> dict:
    """What the job's model answers for its test rows, loaded in the runtime image."""
    config = docker_api.create_host_config(binds={str(job_dir): {"bind": "/out", "mode": "ro"}})
    container = docker_api.create_container(RUNTIME, command=["python3", "-c", script], host_config=config,
                                            environment={"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore"})
    try:
        docker_api.start(container)
        status = docker_api.wait(container, timeout=300)["StatusCode"]
        output = docker_api.logs(container, stderr=False).decode()
    finally:
        docker_api.remove_container(container, force=True)
    assert status == 0, docker_api.logs(container) if status else output
    return json.loads(output.strip().splitlines()[-1])


def submit(cli, job_id: str, image: str, job_dir: str, *args: str, stream: bool = True):
    return cli("jobs", "submit", "training", job_id, "--master-image-uri", image, "--scale-tier", "BASIC",
               "--region", "us-central1", "--job-dir", job_dir, *(["--stream-logs"] if stream else []),
               "--", *args, timeout=600)


def job_of(cli, job_id: str) -> dict:
    return yaml.safe_load(cli("jobs", "describe", job_id, "--format", "json").stdout)


CASES = {
    # algorithm: (its flags, the layout, the model's check, the target)
    "linear_learner": (("--model_type=classification", "--max_steps=60", "--learning_rate=0.1", "--batch_size=50"),
                       TENSORFLOW_LAYOUT, PREDICT_TENSORFLOW, "census.csv"),
    "wide_deep_learner": (("--model_type=regression", "--max_steps=60", "--use_wide", "--embed_categories",
                           "--hidden_units=16,8", "--dnn_learning_rate=0.01", "--batch_size=32"),
                          TENSORFLOW_LAYOUT, PREDICT_TENSORFLOW, "regression.csv"),
    "boosted_trees": (("--objective=binary:logistic", "--num_boost_round=10", "--max_depth=3", "--eta=0.5"),
                      XGBOOST_LAYOUT, PREDICT_XGBOOST, "census.csv"),
    "tab_net": (("--model_type=classification", "--max_steps=60", "--batch_size=64", "--feature_dim=8",
                 "--num_decision_steps=2", "--learning_rate=0.05"), TENSORFLOW_LAYOUT, PREDICT_TENSORFLOW,
                "census.csv"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_algorithm_runs_the_services_command_line(name, cli, gcs_home, bucket, algorithm_images, docker_api):
    algorithm = algorithm_images[name]
    args, expected_layout, check, data = CASES[name]
    if name == "boosted_trees":  # a submit builds a missing algorithm image, as `docker run` pulls
        docker_api.remove_image(algorithm.image, force=True)
        for other in algorithm.images[1:]:
            try:
                docker_api.remove_image(other, force=True)
            except docker.errors.NotFound:
                pass
    job_id = f"{name}_{uuid.uuid4().hex[:6]}"
    job_dir = f"gs://{bucket}/{name}"
    result = submit(cli, job_id, algorithm.images[-1], job_dir, "--preprocess",
                    f"--training_data_path=gs://{bucket}/{data}", *args)
    assert result.returncode == 0, result.stderr[-5000:]
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    if name == "boosted_trees":
        assert f"Built-in algorithm image [{algorithm.image}] is not on this Docker engine: building it now" in \
            result.stderr
    out = local(gcs_home, job_dir)
    assert layout(out) == expected_layout

    config = yaml.safe_load((out / "model" / "deployment_config.yaml").read_text())
    metadata = json.loads((out / "artifacts" / "metadata.json").read_text())
    assert config["deploymentUri"] == f"{job_dir}/model" and config["framework"] == algorithm.framework
    assert (config["runtimeVersion"], config["pythonVersion"]) == ("2.11", "3.9")
    predicted = predict(docker_api, out, check)
    pairs = list(zip(predicted["targets"], predicted["predicted"], strict=True))
    if data == "census.csv":
        assert [c["type"] for c in metadata["columns"]] == ["numerical", "categorical", "categorical", "numerical", "key"]
        assert metadata["target"]["classes"] == ["<=50K", ">50K"]
        assert float(config["labels"]["accuracy"]) >= 100 * ACCURACY_FLOOR, config
        assert sum(target == guess for target, guess in pairs) / len(pairs) >= ACCURACY_FLOOR, predicted
    else:
        rmse = (sum((float(t) - p) ** 2 for t, p in pairs) / len(pairs)) ** 0.5
        assert float(config["labels"]["rmse"]) < 2.0 and rmse < 2.0  # the target's spread is about 2.3
    counted = sum(metadata["rows"][key] for key in ("training", "validation", "test", "dropped_by_preprocessing"))
    assert counted == len(local(gcs_home, f"gs://{bucket}/{data}").read_text().splitlines())

    job = job_of(cli, job_id)
    assert job["trainingOutput"] == {"isBuiltInAlgorithmJob": True, "builtInAlgorithmOutput": {
        "framework": algorithm.framework, "runtimeVersion": "2.11", "pythonVersion": "3.9",
        "modelPath": f"{job_dir}/model/"}}
    assert job_resources(docker_api, job_id) == []


def test_a_bad_flag_fails_the_job_with_one_line(cli, gcs_home, bucket, algorithm_images):
    job_id = f"bad_flag_{uuid.uuid4().hex[:6]}"
    result = submit(cli, job_id, algorithm_images["linear_learner"].image, f"gs://{bucket}/bad", "--preprocess",
                    "--model_type=classification", f"--training_data_path=gs://{bucket}/census.csv", "--max_steps=0",
                    stream=True)
    assert result.returncode != 0
    job = job_of(cli, job_id)
    assert job["state"] == "FAILED"
    assert "ERROR: --max_steps=0 is out of range: it takes an integer of at least 1." in job["errorMessage"]
    assert "Traceback" not in job["errorMessage"]
    assert job["trainingOutput"]["builtInAlgorithmOutput"].get("modelPath") is None  # only a job that succeeded


def test_a_tuning_study_over_the_linear_learner(cli, gcs_home, bucket, algorithm_images, tmp_path):
    """The metric the algorithm reports (accuracy) is the study's; each trial's model is in its own
    job dir, as trials[].builtInAlgorithmOutput.modelPath says."""
    job_id = f"tune_ll_{uuid.uuid4().hex[:6]}"
    config = tmp_path / "tuning.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {
        "scaleTier": "BASIC", "region": "us-central1", "jobDir": f"gs://{bucket}/tune",
        "masterConfig": {"imageUri": algorithm_images["linear_learner"].image},
        "args": ["--preprocess", "--model_type=classification", f"--training_data_path=gs://{bucket}/census.csv",
                 "--max_steps=40", "--batch_size=50"],
        "hyperparameters": {"goal": "MAXIMIZE", "hyperparameterMetricTag": "accuracy", "maxTrials": 2,
                            "maxParallelTrials": 1, "params": [{"parameterName": "learning_rate", "type": "DOUBLE",
                                                                "minValue": 0.05, "maxValue": 0.5,
                                                                "scaleType": "UNIT_LOG_SCALE"}]},
    }}))
    result = cli("jobs", "submit", "training", job_id, "--config", str(config), "--stream-logs", timeout=600)
    assert result.returncode == 0, result.stderr[-5000:]
    job = job_of(cli, job_id)
    output = job["trainingOutput"]
    assert job["state"] == "SUCCEEDED" and output["isBuiltInAlgorithmJob"] is True
    assert output["hyperparameterMetricTag"] == "accuracy" and output["completedTrialCount"] == "2"
    assert "modelPath" not in output["builtInAlgorithmOutput"]  # the job's: its trials have theirs
    for trial in output["trials"]:
        model_path = f"gs://{bucket}/tune/{trial['trialId']}/model/"
        assert trial["builtInAlgorithmOutput"] == {"framework": "TENSORFLOW", "runtimeVersion": "2.11",
                                                   "pythonVersion": "3.9", "modelPath": model_path}
        assert 0.5 <= trial["finalMetric"]["objectiveValue"] <= 1.0
        assert trial["finalMetric"]["trainingStep"] == "40"
        assert (local(gcs_home, model_path) / "saved_model.pb").is_file()


def test_a_rest_create_names_the_image_in_master_config(gcs_home, bucket, algorithm_images):
    """The body a pipeline posts: trainingOutput says it is a built-in algorithm's job from its
    creation on, as the service's answer did."""
    with serving() as url:
        jobs = ml_api(url).projects().jobs()
        job_id = f"rest_xgb_{uuid.uuid4().hex[:6]}"
        body = {"jobId": job_id, "trainingInput": {
            "scaleTier": "BASIC", "region": "us-central1", "jobDir": f"gs://{bucket}/rest",
            "masterConfig": {"imageUri": algorithm_images["boosted_trees"].image},
            "args": ["--preprocess", f"--training_data_path=gs://{bucket}/census.csv", "--objective=multi:softprob",
                     "--num_boost_round=5", "--eval_metric=mlogloss"]}}
        created = jobs.create(parent=f"projects/{PROJECT}", body=body).execute()
        assert created["trainingOutput"] == {"isBuiltInAlgorithmJob": True, "builtInAlgorithmOutput": {
            "framework": "XGBOOST", "runtimeVersion": "2.11", "pythonVersion": "3.9"}}
        name = f"projects/{PROJECT}/jobs/{job_id}"
        deadline = time.monotonic() + 300
        while (job := jobs.get(name=name).execute())["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
            assert time.monotonic() < deadline, job
            time.sleep(1)
    assert job["state"] == "SUCCEEDED", job
    assert job["trainingOutput"]["builtInAlgorithmOutput"]["modelPath"] == f"gs://{bucket}/rest/model/"
    assert (local(gcs_home, f"gs://{bucket}/rest") / "model" / "model.bst").is_file()


def test_the_issues_gcloud_command_runs_unchanged(gcs_home, algorithm_images, tmp_path):
    """Google's real gcloud, the data uploaded with `gcloud storage cp`, and the command line of
    issue 38 as users wrote it (the default number of steps: 10 epochs of the data)."""
    (tmp_path / "census.csv").write_text("\n".join(census_rows(200)) + "\n")
    with serving() as url:
        gcloud = configured_gcloud(url, tmp_path, project=PROJECT)
        bucket = f"census-{uuid.uuid4().hex[:8]}"
        gcloud("storage", "buckets", "create", f"gs://{bucket}")
        gcloud("storage", "cp", str(tmp_path / "census.csv"), f"gs://{bucket}/census.csv")
        # The region, as a user's configuration had it (`gcloud config set` asks Compute Engine's API first).
        with open(tmp_path / "gcloud-config" / "configurations" / "config_aiptrain", "a") as configuration:
            configuration.write("\n[compute]\nregion = us-central1\n")
        assert gcloud("config", "get-value", "compute/region").stdout.strip() == "us-central1"
        job_id = f"census_ll_{uuid.uuid4().hex[:6]}"
        gcloud("ai-platform", "jobs", "submit", "training", job_id, "--master-image-uri",
               "gcr.io/cloud-ml-algos/linear_learner_cpu:latest", "--scale-tier", "BASIC", "--job-dir",
               f"gs://{bucket}/out", "--", "--preprocess", "--model_type=classification",
               f"--training_data_path=gs://{bucket}/census.csv")
        deadline = time.monotonic() + 300
        while (job := describe(gcloud, job_id))["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
            assert time.monotonic() < deadline, job
            time.sleep(1)
        assert job["state"] == "SUCCEEDED", job
        assert job["trainingOutput"]["isBuiltInAlgorithmJob"] is True
        assert job["trainingOutput"]["builtInAlgorithmOutput"]["modelPath"] == f"gs://{bucket}/out/model/"
        listed = gcloud("storage", "ls", f"gs://{bucket}/out/model/").stdout
        assert f"gs://{bucket}/out/model/saved_model.pb" in listed
        assert f"gs://{bucket}/out/model/deployment_config.yaml" in listed
        logs = gcloud("ai-platform", "jobs", "stream-logs", job_id).stdout + \
            gcloud("ai-platform", "jobs", "stream-logs", job_id).stderr
        assert "Model written to" in logs


def test_algorithms_list_and_build_say_what_is_built(cli, algorithm_images):
    listed = cli("algorithms", "list")
    assert listed.returncode == 0, listed.stderr
    for algorithm in algorithm_images.values():
        assert algorithm.image in listed.stdout
    built = cli("algorithms", "build", "tab_net", "boosted_trees")
    assert built.returncode == 0, built.stderr
    assert "Built-in TabNet: gcr.io/cloud-ml-algos/tab_net:latest is already built (--force rebuilds it)." in built.stdout
    refused = cli("algorithms", "build", "kmeans")
    assert refused.returncode == 2 and "Unknown built-in algorithm [kmeans]" in refused.stderr

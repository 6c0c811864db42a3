"""Trainers of the runtime 2.1-2.5 era on the images those versions build here (TensorFlow 2.5.3
standing in for 2.1-2.4 on Python 3.9), with gs:// kept on the host (AIPTRAIN_GCS=local) and
served to every replica by the installation's storage endpoint (docs/guide/storage.md): an
Estimator `train_and_evaluate` on STANDARD_1 (chief, 4 workers, 3 parameter servers) on runtime
2.3 checkpointing to a gs:// model_dir; a Keras trainer on runtime 2.1 reading CSVs from gs://
paths it builds from --bucket and writing checkpoints, events and a SavedModel to gs://; an
XGBoost trainer uploading its model with google-cloud-storage on runtime 2.5 (TensorFlow 2.5.0's
image); a scikit-learn trainer running gsutil and gcloud storage on runtime 2.3 (the trainers of
test_gcs_endpoint.py, there on 2.11). What they write is plain files under $AIPTRAIN_HOME/gcs.
They need images beyond `make images`: `make test-runtimes` builds them and runs these."""

from __future__ import annotations

import re
import uuid

import pytest
import yaml

from conftest import REPO, job_resources, require_image, runtime_image
from test_gcs_endpoint import SKLEARN, XGBOOST, assert_the_sklearn_trainer_used_the_tools, linear_rows, package, stage

pytestmark = [pytest.mark.tensorflow, pytest.mark.runtimes]

TRAINERS = REPO / "tests" / "trainers"


def submit(cli, job_id, trainer, version, job_dir, *flags, user_args=(), module=None):
    package_path = trainer if not isinstance(trainer, str) else TRAINERS / trainer
    return cli("jobs", "submit", "training", job_id, "--package-path", str(package_path),
               "--module-name", module or f"{trainer}.task", "--job-dir", job_dir, "--region", "us-central1",
               "--runtime-version", version, *flags, "--stream-logs", "--", *user_args, timeout=900)


def test_an_estimator_on_standard_1_with_runtime_2_3_checkpoints_to_gs(cli, gcs_home, tmp_path, docker_api):
    require_image(docker_api, runtime_image("2.3"))
    stage(gcs_home, tmp_path, "estimator-out", {})  # the bucket exists, as it must on the service
    result = submit(cli, "estimator_2_3", "estimator_ps", "2.3", "gs://estimator-out/runs/1", "--scale-tier",
                    "STANDARD_1", user_args=("--train-steps", "200"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    assert "NOTE: runtime 2.3 runs TensorFlow 2.5.3" in result.stderr
    assert "TensorFlow 2.5.3, task chief 0" in result.stderr
    for task in ("ps-replica-2", "worker-replica-3"):
        assert f"{task}\t" in result.stderr, f"{task} never logged"
    model = gcs_home / "gcs" / "estimator-out" / "runs" / "1" / "model"
    state = (model / "checkpoint").read_text()
    step = int(re.search(r'model_checkpoint_path: "model.ckpt-(\d+)"', state).group(1))
    assert step >= 200 and (model / f"model.ckpt-{step}.index").is_file()
    assert "Latest checkpoint: gs://estimator-out/runs/1/model/model.ckpt-" in result.stderr
    assert [p for p in model.rglob("events.out.tfevents.*") if p.is_file() and p.stat().st_size > 0]
    assert job_resources(docker_api, "estimator_2_3") == []


def classified_rows(count: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        x1, x2 = rng.uniform(-1, 1), rng.uniform(-1, 1)
        rows.append(f"{x1:.4f},{x2:.4f},{int(x1 - 2 * x2 > 0)}\n")
    return "x1,x2,label\n" + "".join(rows)


def test_a_keras_trainer_on_runtime_2_1_reads_and_writes_gs_paths_it_builds(cli, gcs_home, tmp_path, docker_api):
    require_image(docker_api, runtime_image("2.1"))
    stage(gcs_home, tmp_path, "keras-data", {"data/train-0.csv": classified_rows(256, 0),
                                             "data/train-1.csv": classified_rows(256, 1),
                                             "data/eval.csv": classified_rows(64, 2)})
    result = submit(cli, "keras_2_1", "keras_checkpoints", "2.1", "gs://keras-data/jobs/run1",
                    user_args=("--bucket", "keras-data", "--epochs", "3"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    assert "TensorFlow 2.5.3" in result.stderr
    assert "train files 2" in result.stderr and "eval rows 64" in result.stderr
    assert "reloaded from gs:// and predicts the same: True" in result.stderr
    out = gcs_home / "gcs" / "keras-data" / "jobs" / "run1"
    assert (out / "checkpoints" / "checkpoint").is_file() and (out / "checkpoints" / "epoch-03.index").is_file()
    assert (out / "model" / "saved_model.pb").is_file()
    assert list((out / "model" / "variables").glob("variables.data-*"))
    events = [p for p in (out / "logs").rglob("events.out.tfevents.*") if p.is_file()]
    assert events and all(p.stat().st_size > 0 for p in events)
    assert job_resources(docker_api, "keras_2_1") == []


def test_an_xgboost_trainer_on_runtime_2_5_uploads_its_model_with_google_cloud_storage(
    cli, gcs_home, tmp_path, docker_api
):
    require_image(docker_api, runtime_image("2.5"))
    result = submit(cli, f"xgb_2_5_{uuid.uuid4().hex[:6]}", package(tmp_path, "xgb_gs", task=XGBOOST), "2.5",
                    "gs://xgb-out/run", module="trainer.task")
    assert result.returncode == 0, result.stderr[-6000:]
    model = gcs_home / "gcs" / "xgb-out" / "run" / "model.bst"
    assert model.is_file() and f"uploaded run/model.bst {model.stat().st_size}" in result.stderr


def test_a_scikit_learn_trainer_on_runtime_2_3_runs_gsutil_and_gcloud_storage(cli, gcs_home, tmp_path, docker_api):
    require_image(docker_api, runtime_image("2.3"))
    stage(gcs_home, tmp_path, "sk-data", {"data/train.csv": linear_rows(20)})
    result = submit(cli, f"sk_2_3_{uuid.uuid4().hex[:6]}", package(tmp_path, "sk_gs", task=SKLEARN), "2.3",
                    "gs://sk-data/out", module="trainer.task", user_args=("--bucket", "sk-data"))
    assert_the_sklearn_trainer_used_the_tools(result, gcs_home)

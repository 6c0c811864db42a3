"""Trainers of the runtime 2.1-2.5 era on the images those versions build here (TensorFlow 2.5.3
standing in for 2.1-2.4 on Python 3.9): an Estimator `train_and_evaluate` on STANDARD_1 (chief,
4 workers, 3 parameter servers) on runtime 2.3, and a Keras trainer on runtime 2.1, each
checkpointing to a local job dir and reaching SUCCEEDED. They need images beyond `make images`:
`make test-runtimes` builds them and runs these."""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import REPO, job_resources, require_image, runtime_image

pytestmark = [pytest.mark.docker, pytest.mark.tensorflow, pytest.mark.runtimes]

TRAINERS = REPO / "tests" / "trainers"


def submit(cli, job_id, trainer, version, job_dir, *flags, user_args=()):
    return cli("jobs", "submit", "training", job_id, "--package-path", str(TRAINERS / trainer),
               "--module-name", f"{trainer}.task", "--job-dir", str(job_dir), "--region", "us-central1",
               "--runtime-version", version, *flags, "--stream-logs", "--", *user_args, timeout=900)


def test_an_estimator_trains_and_evaluates_on_standard_1_with_runtime_2_3(cli, home, tmp_path, docker_api):
    require_image(docker_api, runtime_image("2.3"))
    job_dir = tmp_path / "estimator-out"
    result = submit(cli, "estimator_2_3", "estimator_ps", "2.3", job_dir, "--scale-tier", "STANDARD_1",
                    user_args=("--train-steps", "200"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    assert "NOTE: runtime 2.3 runs TensorFlow 2.5.3" in result.stderr
    assert "TensorFlow 2.5.3, task chief 0" in result.stderr
    for task in ("ps-replica-2", "worker-replica-3"):
        assert f"{task}\t" in result.stderr, f"{task} never logged"
    state = (job_dir / "model" / "checkpoint").read_text()
    step = int(re.search(r'model_checkpoint_path: "model.ckpt-(\d+)"', state).group(1))
    assert step >= 200 and list((job_dir / "model").glob(f"model.ckpt-{step}.index"))
    assert job_resources(docker_api, "estimator_2_3") == []


def test_a_keras_trainer_checkpoints_on_runtime_2_1(cli, home, tmp_path, docker_api):
    require_image(docker_api, runtime_image("2.1"))
    job_dir = tmp_path / "keras-out"
    result = submit(cli, "keras_2_1", "keras_checkpoints", "2.1", job_dir, user_args=("--epochs", "3"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    assert "TensorFlow 2.5.3" in result.stderr
    assert (job_dir / "checkpoints" / "epoch-03.index").is_file()
    assert (job_dir / "model" / "saved_model.pb").is_file()
    assert job_resources(docker_api, "keras_2_1") == []

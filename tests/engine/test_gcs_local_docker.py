"""Jobs with gs:// kept on this machine (no credentials), on the real engine."""

from __future__ import annotations

import uuid

import pytest
import yaml

import test_gcs_local
from conftest import SAMPLE_TRAINER, job_resources, require_image

no_credentials = test_gcs_local.no_credentials  # fixtures of test_gcs_local


def describe(cli, job_id: str):
    result = cli("jobs", "describe", job_id, check_code=0)
    return yaml.safe_load(result.stdout), result.stderr


@pytest.mark.parametrize("mode", ["AIPTRAIN_GCS=local", "no credentials"])
def test_basic_job_with_gs_job_dir_and_staging_bucket_runs_offline(
    mode, cli, home, no_credentials, monkeypatch, minimal_runtime, docker_api
):
    if mode == "AIPTRAIN_GCS=local":
        monkeypatch.setenv("AIPTRAIN_GCS", "local")
    job_id = f"gcs_local_{uuid.uuid4().hex[:8]}"
    result = cli(
        "jobs", "submit", "training", job_id, "--package-path", str(SAMPLE_TRAINER), "--module-name", "trainer.task",
        "--job-dir", "gs://my-bucket/jobs/x", "--staging-bucket", "gs://my-bucket",
        "--runtime-version", minimal_runtime, "--stream-logs", "--", "--steps", "10",
    )
    assert result.returncode == 0, result.stderr
    assert (result.stderr.count("No Google Cloud credentials found") == 1) == (mode == "no credentials")
    job_dir = home / "gcs" / "my-bucket" / "jobs" / "x"
    # The trainer is told the gs:// URL, as on the service (this one writes with open(): into its own /tmp).
    assert "Running command: python3 -m trainer.task --steps 10 --job-dir gs://my-bucket/jobs/x" in result.stderr

    job, epilogue = describe(cli, job_id)
    assert job["state"] == "SUCCEEDED"
    assert job["trainingInput"]["jobDir"] == "gs://my-bucket/jobs/x"
    [package_uri] = job["trainingInput"]["packageUris"]
    assert package_uri.startswith(f"gs://my-bucket/{job_id}/") and package_uri.endswith("/trainer-0.0.0.tar.gz")
    staged = home / "gcs" / package_uri[len("gs://"):]
    assert staged.is_file()
    assert not job_dir.exists()  # nothing wrote there: Cloud Storage has no directories to make ahead
    assert f"\n  {package_uri} -> {staged}\n" in epilogue

    # A later job installs that package by its gs:// URL: found where the first job staged it.
    second = f"{job_id}_again"
    result = cli(
        "jobs", "submit", "training", second, "--packages", package_uri, "--module-name", "trainer.task",
        "--job-dir", "gs://my-bucket/jobs/again", "--runtime-version", minimal_runtime, "--stream-logs",
        "--", "--steps", "5",
    )
    assert result.returncode == 0, result.stderr
    assert describe(cli, second)[0]["trainingInput"]["packageUris"] == [package_uri]
    assert job_resources(docker_api, job_id) == job_resources(docker_api, second) == []


@pytest.mark.parametrize(
    "case, flags, expected",
    [
        ("escaping job dir", ("--job-dir", "gs://my-bucket/../../etc"), "[gs://my-bucket/../../etc] has a '.' or '..'"),
        ("invalid staging bucket", ("--staging-bucket", "gs://Not_A_Bucket"), "[gs://Not_A_Bucket] is not a valid"),
        ("invalid job dir bucket", ("--job-dir", "gs://192.168.0.1/x"), "cannot be an IP address"),
        ("escaping package", ("--packages", "gs://my-bucket/a/../../../x.tar.gz"), "has a '.' or '..'"),
        ("absent package", ("--packages", "gs://my-bucket/deps/absent-1.0.tar.gz"), "does not exist on this machine"),
        ("unknown mode", ("--job-dir", "gs://my-bucket/out"), "AIPTRAIN_GCS=[bogus] is not one of"),
    ],
)
def test_bad_gs_input_exits_2_with_one_line_and_nothing_created(
    case, flags, expected, cli, home, no_credentials, monkeypatch, minimal_runtime, docker_api
):
    if case == "unknown mode":
        monkeypatch.setenv("AIPTRAIN_GCS", "bogus")
    job_id = "gcs_bad_" + case.replace(" ", "_")
    job_dir = () if "--job-dir" in flags else ("--job-dir", "gs://my-bucket/jobs/bad")
    result = cli(
        "jobs", "submit", "training", job_id, "--package-path", str(SAMPLE_TRAINER), "--module-name", "trainer.task",
        "--runtime-version", minimal_runtime, *job_dir, *flags,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("ERROR: "), result.stderr
    assert expected in result.stderr
    assert cli("jobs", "list").stderr.strip() == "Listed 0 items."
    assert job_resources(docker_api, job_id) == []
    assert not (home / "gcs").exists() or not any((home / "gcs").iterdir())
    work = home / "work"
    assert not work.exists() or not any(work.iterdir())


TF_TRAINER = '''\
"""Writes to its --job-dir through TensorFlow's own file system layer, as Estimator and Keras
jobs do with a gs:// job dir on AI Platform."""
import argparse
import json
import os

import tensorflow as tf


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True)
    args = parser.parse_args()
    assert json.loads(os.environ["TF_CONFIG"])["job"]["job_dir"] == args.job_dir
    tf.io.gfile.makedirs(args.job_dir)
    with tf.io.gfile.GFile(os.path.join(args.job_dir, "summary.txt"), "w") as handle:
        handle.write("trained")
    checkpoint = tf.train.Checkpoint(step=tf.Variable(7))
    print("Saved " + checkpoint.save(os.path.join(args.job_dir, "checkpoints", "ckpt")), flush=True)


if __name__ == "__main__":
    main()
'''


@pytest.mark.tensorflow
def test_tensorflow_job_with_a_gs_job_dir_succeeds_offline(cli, home, no_credentials, tmp_path, docker_api):
    require_image(docker_api, "aiptrain/runtime:2.11")
    root = tmp_path / "tf_gfile"
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "__init__.py").write_text("")
    (root / "trainer" / "task.py").write_text(TF_TRAINER)
    (root / "setup.py").write_text("from setuptools import setup\nsetup(name='tf_gfile', version='0.1', packages=['trainer'])\n")
    job_id = f"gcs_local_tf_{uuid.uuid4().hex[:8]}"
    result = cli(
        "jobs", "submit", "training", job_id, "--package-path", str(root / "trainer"), "--module-name", "trainer.task",
        "--job-dir", "gs://my-bucket/tf/run1", "--runtime-version", "2.11", "--stream-logs",
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    job_dir = home / "gcs" / "my-bucket" / "tf" / "run1"
    assert (job_dir / "summary.txt").read_text() == "trained"
    assert 'model_checkpoint_path: "ckpt-1"' in (job_dir / "checkpoints" / "checkpoint").read_text()
    assert (job_dir / "checkpoints" / "ckpt-1.index").is_file()
    job, _ = describe(cli, job_id)
    assert job["state"] == "SUCCEEDED" and job["trainingInput"]["jobDir"] == "gs://my-bucket/tf/run1"
    assert job_resources(docker_api, job_id) == []

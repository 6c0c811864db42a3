"""Jobs with a staging bucket and gs:// paths in Cloud Storage (gcp-storage-emulator) on the real
engine."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from aiptrain.packaging import build_sdist

import test_gcs
from conftest import job_resources
from test_gcs import free_port

emulator, gcs = test_gcs.emulator, test_gcs.gcs  # fixtures: gcp-storage-emulator and a fresh bucket


def describe(cli, job_id: str) -> dict:
    return yaml.safe_load(cli("jobs", "describe", job_id, check_code=0).stdout)


def test_staging_bucket_gets_the_exact_object_path_and_the_job_succeeds(cli, submit_args, gcs, docker_api):
    result = cli(*submit_args("gcs_staged", "--staging-bucket", f"gs://{gcs.bucket}", "--stream-logs"))
    assert result.returncode == 0, result.stderr
    [name] = gcs.names()
    sha256 = hashlib.sha256(gcs.read(name)).hexdigest()  # one file: the digest of its bytes
    assert name == f"gcs_staged/{sha256}/trainer-0.0.0.tar.gz"
    job = describe(cli, "gcs_staged")
    assert job["state"] == "SUCCEEDED"
    assert job["trainingInput"]["packageUris"] == [f"gs://{gcs.bucket}/{name}"]
    assert job_resources(docker_api, "gcs_staged") == []


def test_identical_resubmit_builds_and_uploads_nothing(cli, submit_args, gcs, docker_api):
    staging = ("--staging-bucket", f"gs://{gcs.bucket}", "--stream-logs", "--verbosity", "debug")
    first = cli(*submit_args("gcs_first", *staging))
    assert first.returncode == 0, first.stderr
    assert "DEBUG: Building an sdist" in first.stderr
    assert len(gcs.emulator.uploads(gcs.bucket)) == 1

    mark = gcs.emulator.mark()
    second = cli(*submit_args("gcs_second", *staging))
    assert second.returncode == 0, second.stderr
    assert gcs.emulator.uploads(gcs.bucket, mark) == []  # not one byte of package sent again
    assert "DEBUG: Reusing the cached sdist trainer-0.0.0.tar.gz" in second.stderr
    assert "DEBUG: Building an sdist" not in second.stderr
    assert "DEBUG: Staged 1 object(s): 0 uploaded, 1 copied inside the bucket" in second.stderr

    first_name, second_name = gcs.names()
    assert first_name.split("/")[1:] == second_name.split("/")[1:]  # same sha256, same file name
    assert gcs.read(first_name) == gcs.read(second_name)
    assert describe(cli, "gcs_second")["trainingInput"]["packageUris"] == [f"gs://{gcs.bucket}/{second_name}"]
    assert job_resources(docker_api, "gcs_first") == job_resources(docker_api, "gcs_second") == []


def _extra_package(root: Path, name: str, out: Path) -> Path:
    package = root / name / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"NAME = {name!r}\n")
    return build_sdist(package, out).path


def test_packages_local_and_gs_extras_in_gclouds_order(cli, submit_args, gcs, tmp_path, docker_api):
    dist = tmp_path / "dist"
    dist.mkdir()
    local_extra = _extra_package(tmp_path / "src", "extra_local", dist)
    gs_extra = _extra_package(tmp_path / "src", "extra_gs", dist)
    gcs.client.bucket(gcs.bucket).blob(f"deps/{gs_extra.name}").upload_from_filename(str(gs_extra))
    gs_uri = f"gs://{gcs.bucket}/deps/{gs_extra.name}"

    result = cli(*submit_args(
        "gcs_extras", "--staging-bucket", f"gs://{gcs.bucket}", "--packages", f"{local_extra},{gs_uri}",
        "--stream-logs",
    ))
    assert result.returncode == 0, result.stderr
    uris = describe(cli, "gcs_extras")["trainingInput"]["packageUris"]
    # gs:// packages are passed through and come first; uploaded ones share one digest.
    assert uris[0] == gs_uri
    trainer_object = uris[2][len(f"gs://{gcs.bucket}/"):]
    digest = hashlib.sha256(local_extra.read_bytes() + gcs.read(trainer_object)).hexdigest()
    assert uris[1:] == [
        f"gs://{gcs.bucket}/gcs_extras/{digest}/{local_extra.name}",
        f"gs://{gcs.bucket}/gcs_extras/{digest}/trainer-0.0.0.tar.gz",
    ]
    installing = "Installed the packages once for every replica: " + " ".join(
        f"/opt/aiptrain/packages/{n}" for n in (gs_extra.name, local_extra.name, "trainer-0.0.0.tar.gz")
    )
    assert installing in result.stderr
    assert job_resources(docker_api, "gcs_extras") == []


GCS_TRAINER = '''\
"""Writes its model to a gs:// job dir with google-cloud-storage, as trainers on AI Platform do."""
import argparse
import json
import os

from google.cloud import storage


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True)
    args = parser.parse_args()
    print("STORAGE_EMULATOR_HOST=" + os.environ.get("STORAGE_EMULATOR_HOST", ""), flush=True)
    bucket, _, prefix = args.job_dir[len("gs://"):].partition("/")
    blob = storage.Client().bucket(bucket).blob(f"{prefix}/model.json".lstrip("/"))
    blob.upload_from_string(json.dumps({"job_dir": args.job_dir}))
    print("Wrote " + args.job_dir + "/model.json", flush=True)


if __name__ == "__main__":
    main()
'''


def test_gs_job_dir_is_reachable_by_the_trainer(cli, gcs, tmp_path, minimal_runtime, docker_api):
    """The trainer gets the gs:// job dir unchanged and reaches the host's emulator through the
    Docker bridge; google-cloud-storage comes from the wheelhouse (the image lacks it)."""
    root = tmp_path / "gcs_trainer"
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "__init__.py").write_text("")
    (root / "trainer" / "task.py").write_text(GCS_TRAINER)
    (root / "setup.py").write_text(
        "from setuptools import setup\n"
        "setup(name='gcs_trainer', version='0.1', packages=['trainer'], install_requires=['google-cloud-storage'])\n"
    )
    job_dir = f"gs://{gcs.bucket}/runs/gcs_job_dir"
    result = cli(
        "jobs", "submit", "training", "gcs_job_dir", "--package-path", str(root / "trainer"),
        "--module-name", "trainer.task", "--job-dir", job_dir, "--runtime-version", minimal_runtime, "--stream-logs",
    )
    assert result.returncode == 0, result.stderr
    assert f"Running command: python3 -m trainer.task --job-dir {job_dir}" in result.stderr
    emulator_lines = [line for line in result.stderr.splitlines() if "STORAGE_EMULATOR_HOST=" in line]
    assert emulator_lines and "localhost" not in emulator_lines[0]  # rewritten to the bridge gateway
    assert json.loads(gcs.read("runs/gcs_job_dir/model.json")) == {"job_dir": job_dir}
    # No --staging-bucket: the packages went to <job dir>/packages/<sha256>/.
    packages = gcs.names("runs/gcs_job_dir/packages/")
    assert any(n.endswith("/gcs_trainer-0.1.tar.gz") for n in packages)
    assert any("/wheelhouse/google_cloud_storage-" in n for n in packages)
    assert job_resources(docker_api, "gcs_job_dir") == []


@pytest.mark.parametrize(
    "case",
    ["missing staging bucket", "missing job dir bucket", "emulator down", "invalid name", "missing gs package"],
)
def test_bucket_errors_exit_2_with_one_line_and_nothing_created(
    case, cli, submit_args, gcs, home, monkeypatch, tmp_path, docker_api
):
    job_id = "gcs_" + case.replace(" ", "_")
    extra: tuple[str, ...] = ("--staging-bucket", f"gs://{gcs.bucket}")
    expected = f"[gs://{gcs.bucket}]"
    missing = "[gs://aiptrain-no-such-bucket] does not exist"
    if case == "missing staging bucket":
        extra, expected = ("--staging-bucket", "gs://aiptrain-no-such-bucket"), missing
    elif case == "missing job dir bucket":
        extra, expected = ("--job-dir", "gs://aiptrain-no-such-bucket/out"), missing
    elif case == "emulator down":
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://localhost:{free_port()}")
        expected = "Cannot reach Cloud Storage"
    elif case == "invalid name":
        extra, expected = ("--staging-bucket", "gs://Not_A_Bucket"), "not a valid bucket name"
    elif case == "missing gs package":
        extra += ("--packages", f"gs://{gcs.bucket}/deps/missing-1.0.tar.gz")
        expected = f"[gs://{gcs.bucket}/deps/missing-1.0.tar.gz] does not exist"

    result = cli(*submit_args(job_id, *extra))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("ERROR: ")
    assert expected in result.stderr
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.emulator.host)
    assert cli("jobs", "list").stderr.strip() == "Listed 0 items."
    assert job_resources(docker_api, job_id) == []
    assert gcs.names() == []
    work = home / "work"
    assert not work.exists() or not any(work.iterdir())
    assert not (tmp_path / f"{job_id}-out").exists()

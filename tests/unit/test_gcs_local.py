"""gs:// without Google Cloud (AIPTRAIN_GCS=local, the default when no credentials are found):
each gs://BUCKET/PATH of a job is the directory $AIPTRAIN_HOME/gcs/BUCKET/PATH, the replicas
get that directory as --job-dir, and the job's record keeps the gs:// URLs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from aiptrain.errors import ValidationError
from aiptrain.staging import fetch, stage
from aiptrain.storage import (
    bucket_name,
    check_gcs_uri,
    gcs_root_for,
    kept_locally,
    local_gcs_path,
    open_bucket,
    validate_bucket_name,
)
from aiptrain.storage.gcs import GcsBucket
from aiptrain.storage.local import LocalGcsBucket

from conftest import SAMPLE_TRAINER

# -- the mapping ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("gs://my-bucket/jobs/x", "my-bucket/jobs/x"),
        ("gs://my-bucket/jobs/x/", "my-bucket/jobs/x"),
        ("gs://my-bucket", "my-bucket"),
        ("gs://my-bucket/a//b", "my-bucket/a/b"),
        ("gs://data.example.com/deep/er/model.h5", "data.example.com/deep/er/model.h5"),
        ("gs://my_bucket-2/..x/y..", "my_bucket-2/..x/y.."),  # dots inside a name are only a name
    ],
)
def test_gs_urls_map_under_the_root(tmp_path, uri, expected):
    assert local_gcs_path(tmp_path, uri) == tmp_path.resolve() / expected


@pytest.mark.parametrize(
    "uri",
    ["gs://my-bucket/../../etc", "gs://my-bucket/jobs/../../other-bucket/x", "gs://my-bucket/./x", "gs://my-bucket/.."],
)
def test_paths_that_could_leave_the_bucket_are_refused(tmp_path, uri):
    with pytest.raises(ValidationError) as caught:
        local_gcs_path(tmp_path, uri)
    message = str(caught.value)
    assert message.startswith(f"[{uri}] has a '.' or '..' segment") and "\n" not in message
    check_gcs_uri(uri, kept_locally=False)  # Cloud Storage itself takes such names literally


def test_a_symlink_out_of_the_bucket_is_refused(tmp_path):
    root = tmp_path / "gcs"
    (root / "my-bucket").mkdir(parents=True)
    (root / "my-bucket" / "link").symlink_to(tmp_path)
    with pytest.raises(ValidationError, match="escapes the bucket"):
        local_gcs_path(root, "gs://my-bucket/link/x")


@pytest.mark.parametrize(
    "name", ["abc", "my-bucket", "my_bucket", "a.b.c", "0-numbers-9", "x" * 63, ".".join(["x" * 63] * 3)]
)
def test_valid_bucket_names(name):
    validate_bucket_name(name)  # raises ValidationError for a name the rules refuse
    assert bucket_name(f"gs://{name}") == name


@pytest.mark.parametrize(
    "name, problem",
    [
        ("ab", "3-63 characters"),
        ("x" * 64, "3-63 characters"),
        ("", "3-63 characters"),
        ("My-Bucket", "lowercase letters"),
        ("-bucket", "starting and ending with a letter or digit"),
        ("bucket_", "starting and ending with a letter or digit"),
        ("buck et", "lowercase letters"),
        ("a/b", "lowercase letters"),
        ("..", "3-63 characters"),
        ("...", "lowercase letters"),
        ("a..b", "dot-separated part"),
        ("x" * 64 + ".com", "dot-separated part"),
        ("192.168.5.4", "IP address"),
        ("goog-bucket", "'goog'"),
        ("my-google-bucket", "'google'"),
        ("my-g00gle-bucket", "'google'"),
    ],
)
def test_invalid_bucket_names_say_why_in_one_line(name, problem):
    with pytest.raises(ValidationError) as caught:
        validate_bucket_name(name)
    message = str(caught.value)
    assert message.startswith(f"[gs://{name}] is not a valid bucket name: ") and problem in message
    assert "\n" not in message


# -- which mode --------------------------------------------------------------------------------------


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    """An environment with nothing Application Default Credentials could use."""
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "GCE_METADATA_HOST", "AIPTRAIN_GCS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud-config"))
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # for the CLI's own processes, even on a GCE VM
    monkeypatch.setattr("aiptrain.storage.GCE_PRODUCT_NAME_FILE", tmp_path / "no-dmi")
    return tmp_path


def test_without_credentials_gs_is_kept_locally_and_said_so(no_credentials):
    root = no_credentials / "gcs"
    kept, notice = gcs_root_for("auto", root)
    assert kept == root
    assert notice.startswith("No Google Cloud credentials found: ") and str(root) in notice and "\n" not in notice
    assert gcs_root_for("", root)[0] == root
    assert gcs_root_for("local", root) == (root, None)  # asked for: nothing to warn about
    assert gcs_root_for("remote", root) == (None, None)


@pytest.mark.parametrize("found_by", ["GOOGLE_APPLICATION_CREDENTIALS", "gcloud ADC", "emulator", "GCE VM"])
def test_with_credentials_or_an_emulator_gs_stays_cloud_storage(no_credentials, monkeypatch, found_by):
    key = no_credentials / "key.json"
    key.write_text("{}")
    if found_by == "GOOGLE_APPLICATION_CREDENTIALS":
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    elif found_by == "gcloud ADC":
        (no_credentials / "gcloud-config").mkdir()
        (no_credentials / "gcloud-config" / "application_default_credentials.json").write_text("{}")
    elif found_by == "emulator":
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://localhost:9023")
    else:
        monkeypatch.delenv("NO_GCE_CHECK")
        (no_credentials / "no-dmi").write_text("Google Compute Engine\n")
    assert gcs_root_for("auto", no_credentials / "gcs") == (None, None)
    assert gcs_root_for("local", no_credentials / "gcs") == (no_credentials / "gcs", None)  # the user decides


def test_a_credentials_variable_naming_no_file_finds_no_credentials(no_credentials, monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(no_credentials / "missing.json"))
    assert gcs_root_for("auto", no_credentials / "gcs")[0] == no_credentials / "gcs"


def test_an_unknown_mode_is_one_line():
    with pytest.raises(ValidationError, match=r"^AIPTRAIN_GCS=\[cloud\] is not one of local, remote, auto"):
        gcs_root_for("cloud", Path("/unused"))


# -- a bucket kept on this machine ----------------------------------------------------------------------


def test_open_bucket_keeps_gs_locally_only_when_given_a_root(tmp_path):
    assert isinstance(open_bucket("gs://my-bucket"), GcsBucket)
    bucket = open_bucket("gs://my-bucket", tmp_path)
    assert isinstance(bucket, LocalGcsBucket)
    assert bucket.uri("a/b.tar.gz") == "gs://my-bucket/a/b.tar.gz" and bucket.uri("") == "gs://my-bucket"


def test_staging_keeps_gs_urls_and_fetch_finds_the_files(tmp_path):
    root = tmp_path / "gcs"
    package = tmp_path / "trainer-0.1.tar.gz"
    package.write_bytes(b"package bytes")
    staged = stage([package], "gs://my-bucket", "job1", gcs_root=root)
    digest = hashlib.sha256(b"package bytes").hexdigest()
    assert staged.uris == [f"gs://my-bucket/job1/{digest}/trainer-0.1.tar.gz"]
    assert (root / "my-bucket" / "job1" / digest / "trainer-0.1.tar.gz").read_bytes() == b"package bytes"
    # Another job names the staged package by its gs:// URL: it is found on this machine.
    assert fetch(staged.uris, tmp_path / "work", root) == ["trainer-0.1.tar.gz"]
    assert (tmp_path / "work" / "trainer-0.1.tar.gz").read_bytes() == b"package bytes"
    assert kept_locally(root, [*staged.uris, "gs://my-bucket/absent", "/local/path"]) == [
        (staged.uris[0], root.resolve() / "my-bucket" / "job1" / digest / "trainer-0.1.tar.gz")
    ]
    staged.discard()
    assert list(root.iterdir()) == []  # the bucket's directory went with its only object


def test_a_gs_package_absent_locally_is_one_line(tmp_path):
    with pytest.raises(ValidationError) as caught:
        fetch(["gs://my-bucket/deps/extra-1.0.tar.gz"], tmp_path / "work", tmp_path / "gcs")
    message = str(caught.value)
    assert message.startswith("[gs://my-bucket/deps/extra-1.0.tar.gz] does not exist on this machine")
    assert str(tmp_path / "gcs" / "my-bucket" / "deps" / "extra-1.0.tar.gz") in message and "\n" not in message


# -- what the replicas are told (dry run: no Docker) -------------------------------------------------------


def test_replicas_get_gs_urls_unchanged_as_job_dir_and_in_tf_config(cli, home, no_credentials):
    result = cli(
        "jobs", "submit", "training", "gcs_local_plan", "--package-path", str(SAMPLE_TRAINER),
        "--module-name", "trainer.task", "--job-dir", "gs://my-bucket/jobs/x", "--staging-bucket", "gs://my-bucket",
        "--runtime-version", "minimal", "--region", "us-central1", "--dry-run",
    )
    assert result.returncode == 0, result.stderr
    local = str(home / "gcs" / "my-bucket" / "jobs" / "x")
    assert result.stderr == (
        f"WARNING: No Google Cloud credentials found: this job's gs:// paths are kept on this machine under "
        f"{home / 'gcs'} (set AIPTRAIN_GCS=remote to use Cloud Storage, AIPTRAIN_GCS=local to keep this "
        "without the warning).\n"
    )
    [master] = yaml.safe_load(result.stdout)["containers"]
    # As on the service: the trainer reaches gs:// through the installation's storage endpoint.
    assert master["command"][-2:] == ["--job-dir", "gs://my-bucket/jobs/x"]
    assert yaml.safe_load(master["env"]["TF_CONFIG"])["job"]["job_dir"] == "gs://my-bucket/jobs/x"
    assert not any(m["source"].startswith(local) for m in master["mounts"])
    # ...as its project: google-auth reads the project's credentials file, TensorFlow its token (masked).
    assert "STORAGE_EMULATOR_HOST" not in master["env"]  # the emulator setting makes google-cloud-storage anonymous
    assert "GOOGLE_APPLICATION_CREDENTIALS" in master["env"]
    assert {"target": "/opt/aiptrain/storage/credentials.json", "read_only": True} in \
        [{k: m[k] for k in ("target", "read_only")} for m in master["mounts"]]
    assert master["env"]["GOOGLE_AUTH_TOKEN_FOR_TESTING"] == "*****"
    assert master["env"]["GOOGLE_CLOUD_PROJECT"] == "aiptrain"
    assert not (home / "gcs").exists()  # a dry run creates nothing


def test_package_uris_from_config_are_checked_too(cli, home, no_credentials, tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {
        "packageUris": ["gs://my-bucket/pkgs/../../../outside.tar.gz"], "pythonModule": "trainer.task",
    }}))
    result = cli("jobs", "submit", "training", "gcs_config_uris", "--config", str(config), "--dry-run")
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "ERROR: [gs://my-bucket/pkgs/../../../outside.tar.gz] has a '.' or '..' segment, which could leave the "
        "bucket where gs:// paths are kept on this machine (AIPTRAIN_GCS=local): name the object without them.\n"
    )


# -- real jobs ------------------------------------------------------------------------------------------------



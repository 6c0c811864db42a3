"""Staging paths (gcloud's layout), the local bucket, the staged-object index, and what
replicas get to reach gs:// storage. No Docker, no network."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from aiptrain.backends.engine import host_gateway as docker_host_gateway
from aiptrain.errors import ValidationError
from aiptrain.staging import StagedIndex, combined_sha256, fetch, stage, staging_target
from aiptrain.storage import open_bucket, split_url
from aiptrain.storage.gcs import (
    CONTAINER_CREDENTIALS,
    GcsBucket,
    reachable_from_containers,
    replica_access,
)
from aiptrain.storage.local import LocalBucket, md5_base64
from aiptrain.validation import split_packages

from conftest import SAMPLE_TRAINER

# -- where packages go (reference §6.5) --------------------------------------------------------


@pytest.mark.parametrize(
    "staging_bucket, job_dir, expected",
    [
        ("gs://b", None, ("gs://b", "job_1")),
        ("gs://b", "gs://other/out", ("gs://b", "job_1")),  # the staging bucket wins
        ("gs://b/", None, ("gs://b", "job_1")),
        (None, "gs://b/path/to/out", ("gs://b", "path/to/out/packages")),
        (None, "gs://b", ("gs://b", "packages")),
        ("/srv/bucket", None, ("/srv/bucket", "job_1")),
        (None, "/srv/out", ("/srv/out", "packages")),
        (None, None, ("/home/bucket", "job_1")),
    ],
)
def test_staging_target(staging_bucket, job_dir, expected):
    assert staging_target("job_1", staging_bucket, job_dir, "/home/bucket") == expected


def test_split_url():
    assert split_url("gs://b/a/c/") == ("gs://b", "a/c")
    assert split_url("gs://b") == ("gs://b", "")
    assert split_url("file:///x/y") == ("", "/x/y")


def test_gcs_bucket_names_objects_under_its_prefix():
    bucket = GcsBucket("gs://my-bucket", "jobs/")
    assert bucket.url == "gs://my-bucket"
    assert bucket.uri("job_1/abc/trainer-0.0.0.tar.gz") == "gs://my-bucket/jobs/job_1/abc/trainer-0.0.0.tar.gz"
    assert isinstance(open_bucket("gs://my-bucket/x"), GcsBucket)


@pytest.mark.parametrize("url", ["gs://Upper", "gs://a", "gs://under_score_", "gs://", "gs://-dash"])
def test_invalid_bucket_names_are_one_line(url):
    with pytest.raises(ValidationError) as caught:
        GcsBucket(url)
    assert "\n" not in str(caught.value) and "not a valid bucket name" in str(caught.value)


# -- staging into a local bucket ---------------------------------------------------------------


@pytest.fixture
def files(tmp_path) -> list[Path]:
    first = tmp_path / "src" / "helpers-1.0.tar.gz"
    second = tmp_path / "src" / "trainer-0.0.0.tar.gz"
    first.parent.mkdir()
    first.write_bytes(b"helpers " * 100)
    second.write_bytes(b"trainer " * 100)
    return [first, second]


def test_stage_uses_gclouds_layout_with_one_digest_over_all_files(tmp_path, files):
    staged = stage(files, str(tmp_path / "bucket"), "job_1")
    digest = hashlib.sha256(files[0].read_bytes() + files[1].read_bytes()).hexdigest()
    assert combined_sha256(files) == digest
    root = (tmp_path / "bucket").resolve()
    assert staged.uris == [f"file://{root}/job_1/{digest}/{f.name}" for f in files]
    assert staged.uploaded == staged.created == [f"job_1/{digest}/{f.name}" for f in files]
    assert [(root / "job_1" / digest / f.name).read_bytes() for f in files] == [f.read_bytes() for f in files]


def test_objects_already_staged_are_not_sent_again(tmp_path, files):
    stage(files, str(tmp_path / "bucket"), "out/packages")
    again = stage(files, str(tmp_path / "bucket"), "out/packages")
    assert again.created == [] and again.uploaded == []
    again.discard()  # nothing of its own to remove
    assert all(Path(uri[len("file://"):]).is_file() for uri in again.uris)


def test_the_index_turns_a_new_jobs_upload_into_a_hard_link(tmp_path, files):
    index = StagedIndex(tmp_path / "cache" / "staged-objects.json")
    first = stage(files, str(tmp_path / "bucket"), "job_1", index)
    second = stage(files, str(tmp_path / "bucket"), "job_2", StagedIndex(index.path))
    assert second.uploaded == [] and len(second.created) == 2
    for old, new in zip(first.uris, second.uris, strict=True):
        assert "/job_2/" in new
        assert Path(old[len("file://"):]).stat().st_ino == Path(new[len("file://"):]).stat().st_ino


def test_the_index_never_copies_an_object_whose_content_changed(tmp_path, files):
    index = StagedIndex(tmp_path / "cache" / "staged-objects.json")
    first = stage(files, str(tmp_path / "bucket"), "job_1", index)
    Path(first.uris[0][len("file://"):]).write_bytes(b"tampered")
    second = stage(files, str(tmp_path / "bucket"), "job_2", index)
    assert second.uploaded == [second.created[0]]  # the tampered one was uploaded, the other copied
    assert Path(second.uris[0][len("file://"):]).read_bytes() == files[0].read_bytes()


def test_the_index_only_offers_objects_of_the_same_bucket(tmp_path, files):
    index = StagedIndex(tmp_path / "cache" / "staged-objects.json")
    stage(files, str(tmp_path / "bucket-a"), "job_1", index)
    other = stage(files, str(tmp_path / "bucket-b"), "job_2", index)
    assert len(other.uploaded) == 2


def test_index_is_bounded(tmp_path):
    index = StagedIndex(tmp_path / "index.json")
    bucket = LocalBucket(tmp_path / "b")
    for n in range(StagedIndex.KEEP_PER_FILE + 3):
        index.remember("sha", bucket.uri(f"job_{n}/x"))
    assert index.candidates("sha", bucket)[0] == f"job_{StagedIndex.KEEP_PER_FILE + 2}/x"
    assert len(index.candidates("sha", bucket)) == StagedIndex.KEEP_PER_FILE
    index.save()
    assert StagedIndex(index.path).entries == index.entries
    (tmp_path / "broken.json").write_text("{not json")
    assert StagedIndex(tmp_path / "broken.json").entries == {}


def test_discard_removes_only_what_the_submission_created(tmp_path, files):
    bucket_dir = tmp_path / "bucket"
    stage(files[:1], str(bucket_dir), "shared")  # someone else's object in another digest dir
    staged = stage(files, str(bucket_dir), "shared")
    staged.discard()
    remaining = sorted(p.relative_to(bucket_dir).as_posix() for p in bucket_dir.rglob("*") if p.is_file())
    assert remaining == [f"shared/{combined_sha256(files[:1])}/{files[0].name}"]


def test_wheelhouse_is_staged_beside_the_packages(tmp_path, files):
    wheel = tmp_path / "src" / "six-1.17.0-py2.py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    staged = stage(files, str(tmp_path / "bucket"), "job_1", wheelhouse=[wheel])
    digest = combined_sha256(files)  # the digest is over the packages only, as gcloud's
    root = (tmp_path / "bucket").resolve()
    assert staged.wheelhouse_uris == [f"file://{root}/job_1/{digest}/wheelhouse/{wheel.name}"]
    assert len(staged.uris) == 2


def test_local_bucket_copy_checks_content_and_stays_inside(tmp_path):
    bucket = LocalBucket(tmp_path / "bucket")
    source = tmp_path / "f.tar.gz"
    source.write_bytes(b"abc")
    bucket.upload(source, "a/f.tar.gz")
    assert bucket.copy("a/f.tar.gz", "b/f.tar.gz", md5_base64(source)) == bucket.uri("b/f.tar.gz")
    assert bucket.copy("a/f.tar.gz", "c/f.tar.gz", "wrong-md5") is None
    assert bucket.copy("missing", "c/f.tar.gz", md5_base64(source)) is None
    with pytest.raises(ValidationError):
        bucket.copy("a/f.tar.gz", "../outside", md5_base64(source))


def test_fetch_links_local_objects_in_order(tmp_path, files):
    staged = stage(files, str(tmp_path / "bucket"), "job_1")
    names = fetch(staged.uris, tmp_path / "work")
    assert names == [f.name for f in files]
    assert (tmp_path / "work" / files[0].name).read_bytes() == files[0].read_bytes()


# -- --packages (gcloud's rules) -------------------------------------------------------------------


def test_split_packages_keeps_gs_uris_unchanged_and_resolves_local_paths(files):
    local, remote = split_packages([str(files[0]), "gs://b/deps/extra-1.0.tar.gz"])
    assert local == [files[0].resolve()] and remote == ["gs://b/deps/extra-1.0.tar.gz"]


def test_duplicate_basenames_are_rejected_with_gclouds_message(files):
    with pytest.raises(ValidationError) as caught:
        split_packages([str(files[0]), f"gs://b/x/{files[0].name}"])
    assert str(caught.value) == f"Cannot upload multiple packages with the same filename: [{files[0].name}]"


def test_missing_local_package_is_one_line(cli, tmp_path):
    result = cli(
        "jobs", "submit", "training", "nopkg", "--package-path", str(SAMPLE_TRAINER), "--module-name", "trainer.task",
        "--job-dir", str(tmp_path / "out"), "--packages", str(tmp_path / "nope.tar.gz"),
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "nope.tar.gz" in result.stderr


# -- what replicas get to reach gs:// storage --------------------------------------------------------


@pytest.mark.parametrize(
    "address, expected",
    [
        ("http://localhost:9023", "http://172.17.0.1:9023"),
        ("http://127.0.0.1:9023/", "http://172.17.0.1:9023/"),
        ("localhost:9023", "172.17.0.1:9023"),
        ("http://0.0.0.0:9023", "http://172.17.0.1:9023"),
        ("http://[::1]:9023", "http://172.17.0.1:9023"),
        ("http://storage.internal:9023", "http://storage.internal:9023"),
        ("https://10.1.2.3", "https://10.1.2.3"),
    ],
)
def test_a_loopback_emulator_is_reached_through_the_bridge_gateway(address, expected):
    assert reachable_from_containers(address, "172.17.0.1") == expected
    assert reachable_from_containers(address, None) == address


def test_replica_access_mounts_the_credentials_file_read_only(tmp_path, monkeypatch):
    key = tmp_path / "sa.json"
    key.write_text('{"type": "service_account"}')
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://localhost:9023")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "my-project")
    env, mounts = replica_access("172.17.0.1")
    assert env == {
        "STORAGE_EMULATOR_HOST": "http://172.17.0.1:9023",
        "GOOGLE_CLOUD_PROJECT": "my-project",
        "GOOGLE_APPLICATION_CREDENTIALS": CONTAINER_CREDENTIALS,
    }
    assert mounts == [(str(key.resolve()), CONTAINER_CREDENTIALS)]


def test_replica_access_without_credentials(tmp_path, monkeypatch):
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    for name in ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    assert replica_access(None) == ({}, [])


def test_gateway_of_the_default_bridge():
    class Api:
        def __init__(self, config):
            self.config = config

        def inspect_network(self, name):
            assert name == "bridge"
            return {"IPAM": {"Config": self.config}}

    assert docker_host_gateway(Api([{"Subnet": "172.17.0.0/16", "Gateway": "172.17.0.1"}])) == "172.17.0.1"
    assert docker_host_gateway(Api([{"Subnet": "10.200.0.0/24"}])) == "10.200.0.1"
    assert docker_host_gateway(Api([])) is None


def test_dry_run_passes_a_gs_job_dir_unchanged_and_masks_credentials(cli, tmp_path, monkeypatch):
    key = tmp_path / "sa.json"
    key.write_text('{"type": "service_account", "private_key": "SECRET-KEY-MATERIAL"}')
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    result = cli(
        "jobs", "submit", "training", "gs_plan", "--package-path", str(SAMPLE_TRAINER),
        "--module-name", "trainer.task", "--job-dir", "gs://my-bucket/out", "--dry-run", "--", "--steps", "1",
        check_code=0,
    )
    container = yaml.safe_load(result.stdout)["containers"][0]
    assert container["command"][-2:] == ["--job-dir", "gs://my-bucket/out"]
    assert container["env"]["GOOGLE_APPLICATION_CREDENTIALS"] == "*****"
    assert "SECRET-KEY-MATERIAL" not in result.stdout  # the file is mounted, never its content
    assert {"source": str(key.resolve()), "target": CONTAINER_CREDENTIALS, "read_only": True} in container["mounts"]
    assert not any(m["target"] == "gs://my-bucket/out" for m in container["mounts"])

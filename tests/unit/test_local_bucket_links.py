"""A bucket kept on this machine holds what trainers wrote through the storage endpoint: links
and FIFOs among them. The host side (root) never writes, reads or hashes through them, and
never blocks on them."""

from __future__ import annotations

import os
import threading

import pytest

from aiptrain.errors import ValidationError
from aiptrain.storage.local import LocalBucket, LocalGcsBucket


def finishes(call, seconds: float = 30):
    """Run `call` in a thread; the test fails (instead of hanging) if it blocks."""
    outcome: list = []

    def run():
        try:
            outcome.append(("value", call()))
        except Exception as exc:  # noqa: BLE001 - handed back to the test
            outcome.append(("error", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked on a trainer's file"
    return outcome[0]


@pytest.fixture
def bucket(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("root only")
    gcs = tmp_path / "gcs"
    (gcs / "bkt").mkdir(parents=True)
    return LocalGcsBucket(gcs, "gs://bkt"), gcs / "bkt", outside


def test_an_upload_never_writes_through_a_planted_directory_link(bucket, tmp_path):
    store, root, outside = bucket
    (root / "staging").symlink_to(outside)
    package = tmp_path / "pkg.tar.gz"
    package.write_bytes(b"sdist")
    with pytest.raises(ValidationError):
        store.upload(package, "staging/pkg.tar.gz")
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


def test_an_object_that_is_a_link_is_not_an_object(bucket, tmp_path):
    store, root, outside = bucket
    (root / "pkg.tar.gz").symlink_to(outside / "secret")
    assert store.exists("pkg.tar.gz") is False
    with pytest.raises(ValidationError):
        store.download("pkg.tar.gz", tmp_path / "fetched")
    assert not (tmp_path / "fetched").exists()


def test_a_fifo_object_is_refused_without_blocking(bucket, tmp_path):
    store, root, _ = bucket
    os.mkfifo(root / "pkg.tar.gz")
    assert finishes(lambda: store.exists("pkg.tar.gz")) == ("value", False)
    kind, value = finishes(lambda: store.copy("pkg.tar.gz", "copy.tar.gz", "md5"))
    assert (kind, value) == ("value", None)
    kind, error = finishes(lambda: store.download("pkg.tar.gz", tmp_path / "fetched"))
    assert kind == "error" and isinstance(error, ValidationError)


def test_a_copy_inside_the_bucket_never_links_a_link(bucket, tmp_path):
    store, root, outside = bucket
    package = tmp_path / "pkg.tar.gz"
    package.write_bytes(b"sdist")
    store.upload(package, "a/pkg.tar.gz")
    from aiptrain.storage.local import md5_base64

    md5 = md5_base64(package)
    assert store.copy("a/pkg.tar.gz", "b/pkg.tar.gz", md5) == "gs://bkt/b/pkg.tar.gz"
    assert (root / "b" / "pkg.tar.gz").read_bytes() == b"sdist"
    (root / "a" / "pkg.tar.gz").unlink()
    (root / "a" / "pkg.tar.gz").symlink_to(outside / "secret")
    assert store.copy("a/pkg.tar.gz", "c/pkg.tar.gz", md5) is None


def test_deleting_a_prefix_that_is_a_link_removes_the_link_only(bucket):
    store, root, outside = bucket
    (root / "out").symlink_to(outside)
    store.delete_prefix("out")
    assert not (root / "out").is_symlink() and (outside / "secret").exists()


def test_plain_directory_buckets_keep_working(tmp_path):
    store = LocalBucket(tmp_path / "bucket")
    (tmp_path / "bucket").mkdir()
    source = tmp_path / "x.txt"
    source.write_text("x")
    assert store.upload(source, "d/e/x.txt").endswith("/bucket/d/e/x.txt")
    assert store.exists("d/e/x.txt")
    store.download("d/e/x.txt", tmp_path / "back.txt")
    assert (tmp_path / "back.txt").read_text() == "x"
    with pytest.raises(ValidationError):
        store.uri("../escape")

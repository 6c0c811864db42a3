"""gs:// buckets against a real Cloud Storage emulator (gcp-storage-emulator, started once
per session on a free port), through the real google-cloud-storage client. Nothing is mocked:
uploads are counted from the emulator's own request log."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from aiptrain.errors import ValidationError
from aiptrain.storage.gcs import CHUNK_SIZE, GcsBucket
from aiptrain.storage.local import md5_base64

# -- the emulator ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Emulator:
    port: int
    log: Path

    @property
    def host(self) -> str:
        return f"http://localhost:{self.port}"

    def mark(self) -> int:
        """Where the request log ends now: count requests after it with `uploads`."""
        return self.log.stat().st_size

    def uploads(self, bucket: str, since: int = 0) -> list[str]:
        """Requests that sent object bytes into `bucket` (simple, multipart or resumable)."""
        with self.log.open("rb") as handle:
            handle.seek(since)
            text = handle.read().decode("utf-8", "replace")
        return [line for line in text.splitlines() if f"/upload/storage/v1/b/{bucket}/o" in line]


@pytest.fixture(scope="session")
def emulator(tmp_path_factory):
    """gcp-storage-emulator on 0.0.0.0 (so replicas can reach it through the Docker bridge)."""
    port = free_port()
    log = tmp_path_factory.mktemp("gcs-emulator") / "requests.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "gcp_storage_emulator", "start", "--host=0.0.0.0", f"--port={port}", "--in-memory"],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"gcp-storage-emulator did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        yield Emulator(port, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Gcs:
    client: object
    bucket: str  # a fresh bucket for this test
    emulator: Emulator

    def names(self, prefix: str = "") -> list[str]:
        return sorted(b.name for b in self.client.list_blobs(self.bucket, prefix=prefix))

    def read(self, name: str) -> bytes:
        return self.client.bucket(self.bucket).blob(name).download_as_bytes()


@pytest.fixture
def gcs(emulator, monkeypatch) -> Gcs:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.host)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    client = storage.Client(project="test", credentials=AnonymousCredentials())
    name = f"aiptrain-test-{uuid.uuid4().hex[:12]}"
    client.create_bucket(name)
    return Gcs(client, name, emulator)


# -- the bucket itself -------------------------------------------------------------------------------


def test_gcs_bucket_round_trip(gcs, tmp_path):
    bucket = GcsBucket(f"gs://{gcs.bucket}")
    small = tmp_path / "small.tar.gz"
    small.write_bytes(b"small package")
    assert not bucket.exists("a/small.tar.gz")
    assert bucket.upload(small, "a/small.tar.gz") == f"gs://{gcs.bucket}/a/small.tar.gz"
    assert bucket.exists("a/small.tar.gz")
    bucket.upload(small, "a/small.tar.gz")  # already there: create-only upload is not an error

    bucket.download("a/small.tar.gz", tmp_path / "back" / "small.tar.gz")
    assert (tmp_path / "back" / "small.tar.gz").read_bytes() == b"small package"

    mark = gcs.emulator.mark()
    assert bucket.copy("a/small.tar.gz", "b/small.tar.gz", md5_base64(small)) == f"gs://{gcs.bucket}/b/small.tar.gz"
    assert gcs.emulator.uploads(gcs.bucket, mark) == []  # a server-side copy sends no bytes
    assert bucket.copy("a/small.tar.gz", "c/small.tar.gz", "not-its-md5") is None
    assert bucket.copy("missing", "c/small.tar.gz", md5_base64(small)) is None
    assert gcs.read("b/small.tar.gz") == b"small package"

    bucket.delete_prefix("a")
    assert gcs.names() == ["b/small.tar.gz"]
    bucket.delete_prefix("nothing/here")


def test_large_files_are_uploaded_resumably(gcs, tmp_path):
    big = tmp_path / "big.whl"
    big.write_bytes(os.urandom(CHUNK_SIZE + 1024))
    mark = gcs.emulator.mark()
    GcsBucket(f"gs://{gcs.bucket}").upload(big, "deps/big.whl")
    assert any("uploadType=resumable" in line for line in gcs.emulator.uploads(gcs.bucket, mark))
    assert hashlib.sha256(gcs.read("deps/big.whl")).digest() == hashlib.sha256(big.read_bytes()).digest()


def test_missing_bucket_and_unreachable_endpoint_are_one_line(gcs, monkeypatch, tmp_path):
    source = tmp_path / "f.tar.gz"
    source.write_bytes(b"x")
    with pytest.raises(ValidationError) as caught:
        GcsBucket("gs://aiptrain-no-such-bucket").upload(source, "x/f.tar.gz")
    assert str(caught.value) == (
        "Bucket [gs://aiptrain-no-such-bucket] does not exist: create it "
        "(`gcloud storage buckets create gs://aiptrain-no-such-bucket`) or name another bucket."
    )
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://localhost:{free_port()}")
    with pytest.raises(ValidationError) as caught:
        GcsBucket(f"gs://{gcs.bucket}").exists("x")
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("Cannot reach Cloud Storage at http://localhost:")
    assert f"[gs://{gcs.bucket}]" in str(caught.value) and "start the emulator" in str(caught.value)


# -- submit with gs:// staging ------------------------------------------------------------------------


# -- bucket errors: one line, exit 2, nothing created ---------------------------------------------------



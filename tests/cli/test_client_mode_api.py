"""Client mode without an engine: `aiptrain serve` as a process in its own home (`server`, which
tests/engine/test_client_mode.py runs real jobs against), the gcloud shim following
api_endpoint_overrides/ml, and a bad AIPTRAIN_API or token refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from google.oauth2.credentials import Credentials

from aiptrain.api.access import load_tokens
from aiptrain.api.app import App
from aiptrain.api.server import make_server
from aiptrain.client import Client
from aiptrain.model import Job, State
from aiptrain.settings import Settings
from aiptrain.storage.local import REPLICA_IDS

from conftest import SAMPLE_TRAINER, wait_for
from test_rest_api import raw


class Server:
    def __init__(self, url: str, home: Path):
        self.url, self.home = url, home


@pytest.fixture
def server(home, tmp_path, monkeypatch):
    """`aiptrain serve --port 0` in its own home, as a process; the CLI here in client mode."""
    server_home = tmp_path / "server-home"
    log = tmp_path / "serve.log"
    env = {**os.environ, "AIPTRAIN_HOME": str(server_home)}
    env.pop("AIPTRAIN_API", None)
    with log.open("w") as output:
        process = subprocess.Popen([sys.executable, "-m", "aiptrain", "serve", "--port", "0"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=output)
    try:
        first = wait_for(lambda: log.read_text().partition("\n")[0] if "\n" in log.read_text() else None,
                         what="the server to say where it listens")
        assert first.startswith("Serving the ml v1 API"), log.read_text()
        url = first.split(" on ", 1)[1].split()[0]
        monkeypatch.setenv("AIPTRAIN_API", url)
        monkeypatch.delenv("CLOUDSDK_CORE_PROJECT", raising=False)
        yield Server(url, server_home)
    finally:
        process.terminate()
        process.wait(timeout=30)


def seed(server_home: Path, job_id: str, labels: dict | None = None) -> None:
    with Client(settings=Settings(home=server_home)) as client:
        client.store.create(Job(job_id=job_id, labels=labels))
        client.store.transition(job_id, State.SUCCEEDED, [State.QUEUED])


def test_the_gcloud_shim_follows_api_endpoint_overrides_ml(server, home, monkeypatch):
    seed(server.home, "seeded_job")
    monkeypatch.delenv("AIPTRAIN_API")

    def gcloud(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "aiptrain.cli.shim", *args], capture_output=True, text=True,
                              timeout=60, env={**os.environ})

    assert gcloud("ai-platform", "jobs", "list", "--format", "value(jobId)").stdout == ""
    assert gcloud("config", "set", "api_endpoint_overrides/ml", server.url + "/").returncode == 0
    listed = gcloud("ai-platform", "jobs", "list", "--format", "value(jobId)")
    assert (listed.returncode, listed.stdout) == (0, "seeded_job\n"), listed.stderr
    monkeypatch.setenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_ML", "http://127.0.0.1:1")  # the variable wins, as in gcloud
    refused = gcloud("ai-platform", "jobs", "describe", "seeded_job")
    assert refused.returncode == 3 and refused.stderr.startswith("ERROR: Cannot reach the aiptrain API at")


@pytest.mark.parametrize("url, code, message", [
    ("http://127.0.0.1:1", 3, "Cannot reach the aiptrain API at http://127.0.0.1:1 (AIPTRAIN_API): "),
    ("http://no-such-host.invalid:8080", 3, "Cannot reach the aiptrain API at http://no-such-host.invalid:8080"),
    ("ftp://host:8080", 2, "AIPTRAIN_API [ftp://host:8080] is not an http:// or https:// URL"),
    ("127.0.0.1:8080", 2, "AIPTRAIN_API [127.0.0.1:8080] is not an http:// or https:// URL"),
])
def test_a_bad_aiptrain_api_is_one_line(run, monkeypatch, url, code, message):
    monkeypatch.setenv("AIPTRAIN_API", url)
    for args in (("jobs", "list"), ("jobs", "describe", "x"), ("jobs", "cancel", "x")):
        got, out, err = run(*args)
        assert (got, out) == (code, "")
        assert err.startswith("ERROR: " + message) and err.count("\n") == 1, err


@pytest.fixture
def tokens_server(home, tmp_path):
    """`aiptrain serve --tokens` on a free loopback port (in this process): its URL."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(json.dumps([{"name": "writer", "token": "w" * 24, "projects": ["p"]},
                                  {"name": "reader", "token": "r" * 24, "projects": ["p"], "readOnly": True}]))
    server = make_server(App(Settings(), load_tokens(tokens)), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_client_mode_without_a_good_token_is_one_line(tokens_server, run, monkeypatch, tmp_path):
    monkeypatch.setenv("AIPTRAIN_API", tokens_server)
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", "p")
    submit = ["jobs", "submit", "training", "refused", "--package-path", str(SAMPLE_TRAINER), "--module-name",
              "trainer.task", "--job-dir", "gs://team-b/out", "--runtime-version", "minimal"]
    for token, args, message in [
        ("", ("jobs", "list"), "Request is missing required authentication credential"),
        ("x" * 24, ("jobs", "describe", "j"), "Request had invalid authentication credentials"),
        ("r" * 24, ("jobs", "cancel", "j"), "Permission denied on project [p]: the caller's token is read-only"),
        ("", tuple(submit), "Cloud Storage at http://127.0.0.1:"),
        ("r" * 24, tuple(submit), "Cloud Storage at http://127.0.0.1:"),
    ]:
        monkeypatch.setenv("AIPTRAIN_API_TOKEN", token)
        code, out, err = run(*args)
        assert (code, out) == (2, ""), err
        assert err.startswith("ERROR: " + message) and err.count("\n") == 1, err
        assert "AIPTRAIN_API_TOKEN" in err
    token_file = tmp_path / "token"
    token_file.write_text("r" * 24 + "\n")
    monkeypatch.delenv("AIPTRAIN_API_TOKEN")
    monkeypatch.setenv("AIPTRAIN_API_TOKEN_FILE", str(token_file))
    code, _, err = run("jobs", "list")
    assert (code, err.strip()) == (0, "Listed 0 items.")
    assert not (Settings().gcs_root / "team-b").exists() or not any((Settings().gcs_root / "team-b").rglob("*.gz"))


def test_the_storage_endpoint_keeps_the_api_s_token_rules(tokens_server, monkeypatch):
    """Any token reads, one that is not read-only writes, no token is refused: 401/403 in Google's body."""
    from google.api_core.exceptions import Forbidden
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", tokens_server)

    def bucket(credentials):
        return storage.Client(project="p", credentials=credentials).bucket("team-b")

    writer, reader = bucket(Credentials("w" * 24)), bucket(Credentials("r" * 24))
    writer.create()
    writer.blob("a/x.txt").upload_from_string(b"hello")
    assert reader.blob("a/x.txt").download_as_bytes() == b"hello"
    stored = Settings().gcs_root / "team-b" / "a" / "x.txt"
    assert stored.read_bytes() == b"hello"
    if os.geteuid() == 0:  # a server run as root hands what it writes to the replicas' user
        assert {(p.stat().st_uid, p.stat().st_gid) for p in (stored, stored.parent, stored.parent.parent)} == {
            REPLICA_IDS}
    with pytest.raises(Forbidden, match="read-only"):
        reader.blob("a/y.txt").upload_from_string(b"no")
    for headers in ({}, {"Authorization": "Bearer " + "x" * 24}):  # raw: google-auth would try to refresh
        code, body = raw(tokens_server, "GET", "/storage/v1/b/team-b/o/a%2Fx.txt", headers=headers)
        assert (code, body["error"]["status"]) == (401, "UNAUTHENTICATED")
    code, body = raw(tokens_server, "POST", "/upload/storage/v1/b/team-b/o?uploadType=media&name=a/z.txt",
                     b"z" * 1000)
    assert code == 401
    assert sorted(p.name for p in (Settings().gcs_root / "team-b" / "a").iterdir()) == ["x.txt"]

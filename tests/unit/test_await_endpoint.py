"""A replica started before the storage endpoint serves (a first job's, while the endpoint
starts: DockerBackend.launch) runs BOOTSTRAP with AIPTRAIN_AWAIT_ENDPOINT set: its trainer runs
once a TLS handshake with the endpoint, verified against the installation's CA alone, succeeds,
and it sees what `python3 -m` gives it. Run with this machine's sh and python3 (no Docker), the
trust bundle's replica path replaced by a test installation's."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

from aiptrain.planning import BOOTSTRAP
from aiptrain.storage.endpoint import AWAIT_ENDPOINT, REPLICA_TRUST, _write_tls

TRAINER = """\
import json, os, sys, time
at = time.time()
names = sorted(name for name in globals() if not name.startswith("__"))
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "names": names, "spec": __spec__.name,
                  "await": os.environ.get("AIPTRAIN_AWAIT_ENDPOINT"), "at": at}))
sys.exit(int(os.environ.get("TRAINER_EXIT", "0")))
"""


def installation(directory: Path) -> Path:
    """The TLS files of a new installation: its endpoint's certificate and key, and trust.pem."""
    directory.mkdir()
    _write_tls(directory, None)
    return directory


class Endpoint:
    """A TLS server with an installation's certificate on a port reserved now, which listens
    (and completes handshakes) only from `listen()` on: until then connections are refused."""

    def __init__(self, tls_dir: Path, port: int = 0):
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(tls_dir / "server.pem", tls_dir / "server.key")
        self.socket = socket.socket()
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", port))
        self.port = self.socket.getsockname()[1]
        self.listening_at = 0.0

    def listen(self) -> None:
        self.listening_at = time.time()
        self.socket.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed
            while True:
                connection, _ = self.socket.accept()
                with contextlib.suppress(OSError), self.context.wrap_socket(connection, server_side=True):
                    pass

    def close(self) -> None:
        with contextlib.suppress(OSError):  # never listened
            self.socket.shutdown(socket.SHUT_RDWR)  # wakes its accept, which holds the port otherwise
        self.socket.close()


def bootstrap(tmp_path: Path, tls_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`sh -c BOOTSTRAP probe_trainer ARGS...` in tmp_path, as a replica runs it."""
    (tmp_path / "probe_trainer.py").write_text(TRAINER)
    script = BOOTSTRAP.replace(REPLICA_TRUST, str(tls_dir / "trust.pem"))
    environment = {name: value for name, value in os.environ.items() if not name.startswith("AIPTRAIN_")}
    return subprocess.run(["sh", "-c", script, "probe_trainer", *args], cwd=tmp_path, env={**environment, **env},
                          capture_output=True, text=True, timeout=60)


def seen(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def later(seconds: float, action) -> None:
    timer = threading.Timer(seconds, action)
    timer.daemon = True
    timer.start()


@pytest.fixture
def tls_dir(tmp_path):
    return installation(tmp_path / "tls")


def test_the_trainer_runs_once_the_endpoint_answers_and_sees_what_python_m_gives_it(tmp_path, tls_dir):
    args = ("--steps", "5", "two words", "--job-dir", "gs://b/out")
    direct = bootstrap(tmp_path, tls_dir, *args)
    endpoint = Endpoint(tls_dir)
    later(0.5, endpoint.listen)
    try:
        awaited = bootstrap(tmp_path, tls_dir, *args, **{AWAIT_ENDPOINT: f"localhost:{endpoint.port}"})
    finally:
        endpoint.close()
    assert "Running command: python3 -m probe_trainer --steps 5 two words --job-dir gs://b/out" in awaited.stdout
    after, before = seen(awaited), seen(direct)
    assert after.pop("at") >= endpoint.listening_at > 0
    before.pop("at")
    assert after == before
    assert after["argv"] == [str(tmp_path / "probe_trainer.py"), *args] and after["path0"] == str(tmp_path)
    assert after["await"] is None and after["names"] == ["at", "json", "os", "sys", "time"]


def test_a_server_the_installation_did_not_certify_is_not_taken_for_the_endpoint(tmp_path, tls_dir):
    """What else the host serves at the endpoint's address before its port is published (a web
    server on 443) answers the handshake with a certificate this installation's CA did not sign."""
    impostor = Endpoint(installation(tmp_path / "other"))
    impostor.listen()
    endpoint: list[Endpoint] = []

    def replace_impostor() -> None:
        impostor.close()
        endpoint.append(Endpoint(tls_dir, impostor.port))
        endpoint[0].listen()

    later(0.6, replace_impostor)
    try:
        awaited = bootstrap(tmp_path, tls_dir, **{AWAIT_ENDPOINT: f"localhost:{impostor.port}"})
    finally:
        for server in endpoint:
            server.close()
    assert seen(awaited)["at"] >= endpoint[0].listening_at > 0


def test_the_trainers_exit_status_and_a_missing_module_are_as_with_python_m(tmp_path, tls_dir):
    endpoint = Endpoint(tls_dir)
    endpoint.listen()
    waits = {AWAIT_ENDPOINT: f"localhost:{endpoint.port}"}
    try:
        assert bootstrap(tmp_path, tls_dir, TRAINER_EXIT="3", **waits).returncode == 3
        script = BOOTSTRAP.replace(REPLICA_TRUST, str(tls_dir / "trust.pem"))
        missing = [subprocess.run(["sh", "-c", script, "no_such_trainer"], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=60, env={**os.environ, **env}) for env in ({}, waits)]
    finally:
        endpoint.close()
    assert [r.returncode for r in missing] == [1, 1]
    assert missing[0].stderr == missing[1].stderr and "No module named no_such_trainer" in missing[0].stderr

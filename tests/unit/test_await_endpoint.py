"""A replica started before the storage endpoint listens (a first job's, while the endpoint
starts: DockerBackend.launch) runs BOOTSTRAP with AIPTRAIN_AWAIT_ENDPOINT set: its trainer runs
once a connection to the endpoint succeeds, and it sees what `python3 -m` gives it. Run with
this machine's sh and python3 (no Docker). The launch does not start replicas early where the
host itself listens on the endpoint's port: those connections would reach the host's socket."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from aiptrain.backends.engine import host_listens, listening_in
from aiptrain.planning import BOOTSTRAP
from aiptrain.storage.endpoint import AWAIT_ENDPOINT

TRAINER = """\
import json, os, sys, time
at = time.time()
names = sorted(name for name in globals() if not name.startswith("__"))
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "names": names, "spec": __spec__.name,
                  "await": os.environ.get("AIPTRAIN_AWAIT_ENDPOINT"), "at": at}))
sys.exit(int(os.environ.get("TRAINER_EXIT", "0")))
"""


class Endpoint:
    """A port reserved now, listened on only from `listen()`: until then connections are refused."""

    def __init__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.listening_at = 0.0

    def listen(self) -> None:
        self.listening_at = time.time()
        self.socket.listen()

    def close(self) -> None:
        self.socket.close()


@pytest.fixture
def endpoint():
    server = Endpoint()
    yield server
    server.close()


def bootstrap(cwd: Path, *args: str, module: str = "probe_trainer", **env: str) -> subprocess.CompletedProcess:
    """`sh -c BOOTSTRAP MODULE ARGS...` in `cwd`, as a replica runs it."""
    (cwd / "probe_trainer.py").write_text(TRAINER)
    environment = {name: value for name, value in os.environ.items() if not name.startswith("AIPTRAIN_")}
    return subprocess.run(["sh", "-c", BOOTSTRAP, module, *args], cwd=cwd, env={**environment, **env},
                          capture_output=True, text=True, timeout=60)


def seen(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_the_trainer_runs_once_the_endpoint_listens_and_sees_what_python_m_gives_it(tmp_path, endpoint):
    args = ("--steps", "5", "two words", "--job-dir", "gs://b/out")
    direct = bootstrap(tmp_path, *args)
    timer = threading.Timer(0.5, endpoint.listen)
    timer.start()
    awaited = bootstrap(tmp_path, *args, **{AWAIT_ENDPOINT: f"127.0.0.1:{endpoint.port}"})
    timer.join()
    assert "Running command: python3 -m probe_trainer --steps 5 two words --job-dir gs://b/out" in awaited.stdout
    after, before = seen(awaited), seen(direct)
    assert after.pop("at") >= endpoint.listening_at > 0
    before.pop("at")
    assert after == before
    assert after["argv"] == [str(tmp_path / "probe_trainer.py"), *args] and after["path0"] == str(tmp_path)
    assert after["await"] is None and after["names"] == ["at", "json", "os", "sys", "time"]


def test_the_trainers_exit_status_and_a_missing_module_are_as_with_python_m(tmp_path, endpoint):
    endpoint.listen()
    waits = {AWAIT_ENDPOINT: f"127.0.0.1:{endpoint.port}"}
    assert bootstrap(tmp_path, TRAINER_EXIT="3", **waits).returncode == 3
    missing = [bootstrap(tmp_path, module="no_such_trainer", **env) for env in ({}, waits)]
    assert [r.returncode for r in missing] == [1, 1]
    assert missing[0].stderr == missing[1].stderr and "No module named no_such_trainer" in missing[0].stderr


TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 010012C6:01BB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 0100007F:01BB 0200007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0
"""


@pytest.mark.parametrize(("addresses", "port", "listens"), [
    ({"010012C6"}, 443, True),  # 198.18.0.1:443, listening
    ({"0100007F"}, 443, False),  # 127.0.0.1:443 is a connection there, not a listener
    ({"0100007F"}, 8080, True),
    ({"00000000"}, 443, False),  # nothing on every address
])
def test_listening_sockets_are_read_from_the_kernels_table(addresses, port, listens):
    assert listening_in(TABLE.splitlines(), addresses, port) is listens


def test_the_host_is_seen_listening_on_an_address_or_on_every_address():
    with contextlib.closing(socket.socket()) as one, contextlib.closing(socket.socket()) as every:
        one.bind(("127.0.0.1", 0))
        one.listen()
        every.bind(("0.0.0.0", 0))
        every.listen()
        port = one.getsockname()[1]
        assert host_listens("127.0.0.1", port)
        assert host_listens("198.18.0.1", every.getsockname()[1])  # any gateway
        assert not host_listens("198.18.0.1", port)
    assert not host_listens("127.0.0.1", port)

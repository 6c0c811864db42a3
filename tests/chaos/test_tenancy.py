"""The fault suite's tenancy part (issue 34, item 5): a hostile trainer of project team-b, while
a job of team-a runs (two replicas listening on a port, its output in team-a's bucket), tries
every way it has to reach team-a: team-a's objects through the storage endpoint by its names and
by its address (with its own project's credential, and with none), team-a's replicas by their
host names and by their addresses, and the engine's API on the host. It gets nothing, on the
docker backend and on a single-node swarm; its own bucket takes its output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml

from aiptrain.cli.gsutil import LocalGcs, run
from aiptrain.client import Client
from aiptrain.settings import Settings

from conftest import wait_for
from test_swarm import swarm as swarm  # the single-node swarm fixture

pytestmark = pytest.mark.chaos

AIPTRAIN = [sys.executable, "-m", "aiptrain"]

# Team-a's replicas: listen on 7000 (what a worker or parameter server does) until cancelled.
VICTIM = """
    import socket

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 7000))
    server.listen()
    print("listening", flush=True)
    while True:
        connection, peer = server.accept()
        print("ACCEPTED", peer, flush=True)
        connection.close()
"""

# Team-b's trainer: the standard library only (the minimal runtime), every attempt said in one line.
HOSTILE = """
    import json
    import os
    import socket
    import ssl
    import struct
    import sys
    import urllib.error
    import urllib.request

    targets = json.loads(sys.argv[1])

    def say(kind, target, outcome):
        print("ATTEMPT", kind, target, outcome, flush=True)

    def connect(host, port):
        try:
            socket.create_connection((host, port), timeout=3).close()
            return "OPEN"
        except OSError as exc:
            return "closed " + type(exc).__name__

    for name in targets["names"]:
        try:
            say("name", name, "RESOLVED " + socket.gethostbyname(name))
        except OSError:
            say("name", name, "unresolved")
    for address in targets["addresses"]:
        say("address", address, connect(address, 7000))

    def fetch(url, token, verify=True):
        context = ssl.create_default_context()
        if not verify:  # an address is not a name the certificate covers
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        headers = {"Authorization": "Bearer " + token} if token else {}
        try:
            body = urllib.request.urlopen(urllib.request.Request(url, headers=headers), context=context,
                                          timeout=20).read()
            return "READ " + body[:40].decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return "refused " + str(exc.code)
        except OSError as exc:
            return "failed " + type(exc).__name__

    own = os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"]
    theirs = "/storage/v1/b/team-a-data/o/secret.txt?alt=media"
    endpoint = socket.gethostbyname("storage.googleapis.com")
    for host in ("storage.googleapis.com", "www.googleapis.com"):
        say("endpoint-own-credential", host, fetch("https://" + host + theirs, own))
        say("endpoint-anonymous", host, fetch("https://" + host + theirs, ""))
    say("endpoint-address", endpoint, fetch("https://" + endpoint + theirs, own, verify=False))
    say("endpoint-xml-api", "storage.googleapis.com", fetch("https://storage.googleapis.com/team-a-data/secret.txt", own))
    with open("/proc/net/route") as routes:  # the default route's gateway: the host, seen from here
        gateway = next(socket.inet_ntoa(struct.pack("<L", int(f[2], 16))) for f in
                       (line.split() for line in routes.readlines()[1:]) if f[1] == "00000000")
    for port in (2375, 2376):  # the Docker engine's API over TCP
        say("host-port", gateway + ":" + str(port), connect(gateway, port))
    mine = fetch("https://storage.googleapis.com/storage/v1/b/team-b-out/o/run%2Fmine.txt?alt=media", own)
    print("OWN", mine, flush=True)
"""


def package(tmp_path: Path, name: str, source: str) -> Path:
    root = tmp_path / name
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "__init__.py").write_text("")
    (root / "trainer" / "task.py").write_text(textwrap.dedent(source))
    (root / "setup.py").write_text(f"from setuptools import setup\nsetup(name='{name}', version='0.1', "
                                   "packages=['trainer'])\n")
    return root / "trainer"


def aiptrain(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*AIPTRAIN, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ})


def submit(job_id: str, trainer: Path, backend: str, project: str, *flags: str, stream: bool = False,
           user_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return aiptrain("jobs", "submit", "training", job_id, "--package-path", str(trainer), "--module-name",
                    "trainer.task", "--region", "us-central1", "--runtime-version", "minimal", "--backend", backend,
                    "--project", project, *flags, *(["--stream-logs"] if stream else []), "--", *user_args)


def victim_targets(docker_api, key: str) -> dict[str, list[str]]:
    """Team-a's replicas (of the job of this key) as another job would name them: host names and addresses."""
    names, addresses = [], []
    for container in docker_api.containers(filters={"label": f"aiptrain.job-id={key}"}):
        info = docker_api.inspect_container(container["Id"])
        names.append(info["Config"]["Hostname"])
        addresses += [n["IPAddress"] for n in info["NetworkSettings"]["Networks"].values() if n.get("IPAddress")]
    return {"names": sorted(set(names)), "addresses": sorted(set(addresses))}


@pytest.fixture(params=["docker", "swarm"])
def backend(request, docker_api, monkeypatch, tmp_path):
    if request.param == "swarm":
        request.getfixturevalue("swarm")
        monkeypatch.setenv("AIPTRAIN_SWARM_CONSTRAINTS", "node.role==manager")
    return request.param


def test_a_hostile_trainer_reaches_nothing_of_another_project(backend, gcs_home, docker_api, minimal_runtime,
                                                              tmp_path):
    gcs = LocalGcs(gcs_home / "gcs")
    run(gcs, "mb", ["-p", "team-a", "gs://team-a-data"])
    (tmp_path / "secret.txt").write_text("team-a's secret")
    run(gcs, "cp", [str(tmp_path / "secret.txt"), "gs://team-a-data/secret.txt"])
    run(gcs, "mb", ["-p", "team-b", "gs://team-b-out"])
    (tmp_path / "mine.txt").write_text("team-b's own")
    run(gcs, "cp", [str(tmp_path / "mine.txt"), "gs://team-b-out/run/mine.txt"])
    victim = f"victim_{uuid.uuid4().hex[:6]}"
    config = tmp_path / "two.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"scaleTier": "CUSTOM", "masterType": "n1-standard-4",
                                                        "workerType": "n1-standard-4", "workerCount": 1}}))
    started = submit(victim, package(tmp_path, "victim", VICTIM), backend, "team-a", "--config", str(config),
                     "--job-dir", "gs://team-a-data/run")
    assert started.returncode == 0, started.stderr
    with Client(project="team-a") as client:  # job IDs are per project: the engine knows the job by its key
        key = client.key(victim)
    try:
        targets = wait_for(lambda: (t := victim_targets(docker_api, key)) and len(t["addresses"]) >= 2 and t,
                           timeout=180, what="team-a's replicas to run")
        hostile = f"hostile_{uuid.uuid4().hex[:6]}"
        result = submit(hostile, package(tmp_path, "hostile", HOSTILE), backend, "team-b", "--job-dir",
                        "gs://team-b-out/run", stream=True, user_args=(json.dumps(targets),))
        assert result.returncode == 0, result.stderr[-4000:]
        attempts = [line.split("ATTEMPT ", 1)[1] for line in result.stderr.splitlines() if "ATTEMPT " in line]
        assert len(attempts) == len(targets["names"]) + len(targets["addresses"]) + 8, result.stderr[-4000:]
        for attempt in attempts:
            kind, target, outcome = attempt.split(" ", 2)
            # An address outside every network of the replica's is routed off this host, where this
            # machine's own network may take any connection (a swarm's overlay subnets are not routed
            # here): whether team-a's replica took one is its log's to say, below.
            expected = {"name": ("unresolved",), "address": ("closed", "OPEN"), "host-port": ("closed",),
                        "endpoint-anonymous": ("refused 401",)}.get(kind, ("refused 403",))
            assert outcome.startswith(expected), attempt
        assert any(line.endswith("OWN READ team-b's own") for line in result.stderr.splitlines())
    finally:
        aiptrain("--project", "team-a", "jobs", "cancel", victim)
    wait_for(lambda: yaml.safe_load(aiptrain("--project", "team-a", "jobs", "describe", victim).stdout)["state"] ==
             "CANCELLED", timeout=180, what="team-a's job to end")
    victim_log = Settings().job_paths(key).log.read_text()
    assert victim_log.count("listening") == 2 and "ACCEPTED" not in victim_log  # no connection reached team-a
    assert (gcs_home / "gcs" / "team-a-data" / "secret.txt").read_text() == "team-a's secret"

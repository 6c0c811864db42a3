"""Names and scale on the real engine: a 128-character job ID on a distributed job, many jobs at
once, two aiptrain homes with the same job ID, the PIDs limit, and 500 jobs through one
controller. (How jobs end: tests/engine/test_job_ending_docker.py.)

Most jobs here are custom containers of the minimal runtime image running a few lines of shell
or Python: no packaging, so the tests stay light on a small machine."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from docker.errors import NotFound

from aiptrain.planning import LONE_HOSTNAME

from conftest import job_resources, wait_for

MINIMAL = "aiptrain/runtime:minimal"
LONG_ID = "j" + "x_Y9" * 31 + "abc"  # 128 characters, the longest ID the service allows
CUSTOM = ("--scale-tier", "custom", "--master-machine-type", "n1-standard-4", "--worker-machine-type", "n1-standard-4")


def wait_for_go(gate: Path) -> list[str]:
    """A replica command: wait until a file `go` appears in `gate` (the shared job dir), exit 0."""
    return ["sh", "-c", 'until [ -e "$0/go" ]; do sleep 1; done', str(gate)]


def run_cli(home: Path, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """`aiptrain ARGS...` against the aiptrain home `home`."""
    environment = {**os.environ, "AIPTRAIN_HOME": str(home), "AIPTRAIN_DEFAULT_RUNTIME": "minimal", **env}
    return subprocess.run([sys.executable, "-m", "aiptrain", *args], capture_output=True, text=True,
                          timeout=timeout, env=environment)


def container_job(tmp_path: Path, job_id: str, command: list[str], job_dir: Path, *flags: str,
                  groups: tuple[str, ...] = ()) -> list[str]:
    """Submit flags for a custom-container job of the minimal image: every replica type (the
    master, and the configs named in `groups`) runs `command`."""
    training_input = {"masterConfig": {"imageUri": MINIMAL, "containerCommand": command}}
    training_input.update({group: {"containerCommand": command} for group in groups})
    config = tmp_path / f"{job_id[:40]}.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": training_input}))
    return ["jobs", "submit", "training", job_id, "--config", str(config), "--region", "us-central1",
            "--job-dir", str(job_dir), *flags]


def describe(home: Path, job_id: str) -> dict:
    result = run_cli(home, "jobs", "describe", job_id)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def installation_of(home: Path) -> str:
    from aiptrain.settings import Settings

    return Settings(home=home.resolve()).installation_id


def home_resources(api, home: Path) -> list[str]:
    """The home's jobs' containers and networks (not what the home shares: its storage endpoint,
    its lone replicas' network)."""
    label = f"aiptrain.installation={installation_of(home)}"
    containers = [c["Names"][0] for c in api.containers(all=True, filters={"label": label})
                  if "aiptrain.role" not in c["Labels"]]
    return containers + [n["Name"] for n in api.networks(filters={"label": label}) if "aiptrain.role" not in n["Labels"]]


def wait_until_all_end(home: Path, count: int, timeout: float = 300) -> list[list[str]]:
    def ended():
        rows = [line.split() for line in run_cli(home, "jobs", "list").stdout.splitlines()[1:]]
        done = [row for row in rows if row[1] in ("SUCCEEDED", "FAILED", "CANCELLED")]
        return rows if len(done) == count else None

    return wait_for(ended, timeout=timeout, interval=1, what=f"{count} jobs to end")


# -- a 128-character job ID -------------------------------------------------------------

# Each replica resolves every host of CLUSTER_SPEC, checks its own hostname is its entry and that
# TF_CONFIG names the same cluster, leaves a file, and waits for the others' files.
CLUSTER_CHECK = r"""
import json, os, pathlib, socket, sys, time
job_dir = pathlib.Path(sys.argv[1])
tf, spec = json.loads(os.environ["TF_CONFIG"]), json.loads(os.environ["CLUSTER_SPEC"])
task = spec["task"]
hosts = {a.rsplit(":", 1)[0] for addrs in spec["cluster"].values() for a in addrs}
own = spec["cluster"][task["type"]][task["index"]].rsplit(":", 1)[0]
deadline = time.time() + 60
while time.time() < deadline:
    unresolved = []
    for host in sorted(hosts):
        try:
            socket.gethostbyname(host)
        except OSError:
            unresolved.append(host)
    if not unresolved:
        break
    time.sleep(0.2)
print(f"edge {task['type']} {task['index']} own={own} same={socket.gethostname() == own} "
      f"unresolved={unresolved} tf_matches={tf['cluster'] == spec['cluster']}", flush=True)
(job_dir / f"{task['type']}-{task['index']}.ok").write_text("ok")
while len(list(job_dir.glob("*.ok"))) < len(hosts) and time.time() < deadline:
    time.sleep(0.2)  # every replica stays until all have looked: a stopped one no longer resolves
"""


def test_a_128_character_job_id_runs_a_distributed_job(tmp_path, minimal_runtime, docker_api, home):
    job_dir = tmp_path / "long"
    args = container_job(tmp_path, LONG_ID, ["python3", "-c", CLUSTER_CHECK, str(job_dir)], job_dir,
                         *CUSTOM, "--worker-count", "2", "--stream-logs", groups=("workerConfig",))
    result = run_cli(home, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    edges = [line.split("\t") for line in result.stderr.splitlines() if "\tedge " in line]
    assert sorted(fields[2] for fields in edges) == ["master-replica-0", "worker-replica-0", "worker-replica-1"]
    for fields in edges:
        message = fields[4]
        assert "same=True unresolved=[] tf_matches=True" in message, message
        own = message.split("own=")[1].split()[0]
        assert len(own) <= 63 and own.startswith("jx-y9x-y9")
    job = describe(home, LONG_ID)
    assert (job["jobId"], job["state"]) == (LONG_ID, "SUCCEEDED")
    logs = run_cli(home, "jobs", "stream-logs", LONG_ID).stdout
    assert logs.count("\tedge ") == 3 and "Job completed successfully." in logs
    assert job_resources(docker_api, LONG_ID) == []


def test_a_lone_replica_resolves_its_own_hostname_on_the_default_bridge(tmp_path, minimal_runtime, docker_api, home):
    job_dir = tmp_path / "lone"
    args = container_job(tmp_path, "lone", ["python3", "-c", CLUSTER_CHECK, str(job_dir)], job_dir, "--stream-logs")
    result = run_cli(home, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    edges = [line.split("\t")[4] for line in result.stderr.splitlines() if "\tedge " in line]
    assert len(edges) == 1 and f"own={LONE_HOSTNAME} same=True unresolved=[] tf_matches=True" in edges[0], edges
    assert job_resources(docker_api, "lone") == []


# -- many jobs at once ------------------------------------------------------------------


PAIRS = 4
TWO_REPLICAS = (*CUSTOM, "--worker-count", "1")


@pytest.mark.parametrize("count", [pytest.param(30, id="30-jobs"), pytest.param(100, id="100-jobs", marks=pytest.mark.slow)])
def test_many_concurrent_jobs_and_a_premium_1_job_fit_on_one_engine(count, tmp_path, minimal_runtime, docker_api, home):
    gate = tmp_path / "gate"
    gate.mkdir()
    premium = container_job(tmp_path, "premium", wait_for_go(gate), gate, "--scale-tier", "premium-1",
                            groups=("workerConfig", "parameterServerConfig"))
    # Jobs of two replicas (a network each, picked concurrently) beside one-replica jobs (none).
    pairs = [container_job(tmp_path, f"pair_{i}", wait_for_go(gate), gate, *TWO_REPLICAS, groups=("workerConfig",))
             for i in range(PAIRS)]
    submits = [premium, *pairs] + [container_job(tmp_path, f"many_{i}", wait_for_go(gate), gate) for i in range(count)]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda args: run_cli(home, *args, AIPTRAIN_POLL_SECONDS="5"), submits))
    submitted = time.monotonic() - started
    assert [r.returncode for r in results] == [0] * len(submits), [r.stderr for r in results if r.returncode][:3]

    networks = docker_api.networks(filters={"label": f"aiptrain.installation={installation_of(home)}"})
    subnets = [ipaddress.ip_network(n["IPAM"]["Config"][0]["Subnet"]) for n in networks
               if "aiptrain.role" not in n["Labels"]]
    assert len(subnets) == PAIRS + 1 and len(set(subnets)) == PAIRS + 1  # one-replica jobs share one network
    assert all(s.subnet_of(ipaddress.ip_network("198.18.0.0/15")) for s in subnets)
    assert sorted(s.prefixlen for s in subnets)[0] == 26  # PREMIUM_1: 31 replicas

    (gate / "go").write_text("go")
    rows = wait_until_all_end(home, len(submits))
    print(f"\n{count + 1} jobs: submitted in {submitted:.0f}s, all ended {time.monotonic() - started:.0f}s after the first submit")
    assert {row[1] for row in rows} == {"SUCCEEDED"}
    # The premium job's 31 replicas exit together, and Docker 20.10 then can keep its network's
    # count of endpoints (1 run in 10 or so): the teardown gives up on it after 5 s with nothing
    # listed on it, and the controller's sweep removes it once the engine lets go (docs/design/
    # controller.md). Anything else left, or a network with something on it, is a leak.
    left = home_resources(docker_api, home)
    assert [name for name in left if name.startswith("/") or not kept_empty(docker_api, name)] == []  # "/": a container


def kept_empty(api, name: str) -> bool:
    """A network the engine lists nothing on (and would not remove)."""
    try:
        return not api.inspect_network(name)["Containers"]
    except NotFound:
        return True  # gone meanwhile


# -- two homes, one job ID; the PIDs limit ---------------------------------------


def test_two_homes_run_the_same_job_id_at_once_with_their_own_pids_limits(tmp_path, minimal_runtime, docker_api):
    gate = tmp_path / "gate"
    gate.mkdir()
    homes = {tmp_path / "home-a": "", tmp_path / "home-b": "64"}  # b sets AIPTRAIN_REPLICA_PIDS_LIMIT

    def submit(home: Path):
        limit = {"AIPTRAIN_REPLICA_PIDS_LIMIT": homes[home]} if homes[home] else {}
        return run_cli(home, *container_job(tmp_path, "same_id", wait_for_go(gate), gate), **limit)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(submit, homes))
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    limits = []
    for home in homes:
        (container,) = docker_api.containers(filters={"label": [f"aiptrain.installation={installation_of(home)}",
                                                                "aiptrain.job-id"]})
        assert container["Names"][0] == f"/same_id-master-0-{installation_of(home)[:8]}"
        limits.append(docker_api.inspect_container(container["Id"])["HostConfig"]["PidsLimit"])
        assert describe(home, "same_id")["state"] == "RUNNING"
    assert limits == [4096, 64]
    (gate / "go").write_text("go")
    for home in homes:
        wait_for(lambda home=home: describe(home, "same_id")["state"] == "SUCCEEDED", timeout=120, what="SUCCEEDED")
        assert home_resources(docker_api, home) == []


# -- 500 jobs through one controller ---------------------------------------------------

MANY = 500
MANY_CAP = 8  # replicas running at once


@pytest.mark.slow
def test_500_jobs_submitted_at_once_all_succeed_in_order_through_one_controller(tmp_path, minimal_runtime, docker_api,
                                                                                home, monkeypatch):
    """Submitted from 8 threads through the Python API (as a pipeline would), with room for 8 at a
    time: every job SUCCEEDS (none lost, none failed by the queue) and the one controller's memory
    stays bounded. The order of admission is the queue's rule, tested in test_admission*."""
    from concurrent.futures import ThreadPoolExecutor

    import aiptrain
    from aiptrain.runner import control

    monkeypatch.setenv("AIPTRAIN_MAX_RUNNING_REPLICAS", str(MANY_CAP))
    config = tmp_path / "noop.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"masterConfig": {
        "imageUri": MINIMAL, "containerCommand": ["python3", "-c", "print('done')"]}}}))
    ids = [f"many_{n:04d}" for n in range(MANY)]

    def submit(job_id: str) -> None:
        with aiptrain.Client() as client:
            client.submit_training(job_id, config=config, region="us-central1", job_dir=tmp_path / "out")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(submit, ids))
    peak = 0.0
    with aiptrain.Client() as client:
        def all_ended() -> bool:
            nonlocal peak
            info = control.running(client.settings)
            if info and info.pid:
                status = Path(f"/proc/{info.pid}/status")
                if status.exists():
                    peak = max(peak, int(status.read_text().split("VmRSS:")[1].split()[0]) / 1024)
            return not set(ids) & set(client.store.active_job_ids())

        wait_for(all_ended, timeout=3600, interval=2, what=f"{MANY} jobs to end")
        jobs = [client.get(job_id) for job_id in ids]
    assert [job.state.value for job in jobs] == ["SUCCEEDED"] * MANY  # every one recorded, every one ran
    print(f"\n{MANY} jobs: controller peak RSS {peak:.0f} MB")
    assert 0 < peak < 400
    assert home_resources(docker_api, home) == []

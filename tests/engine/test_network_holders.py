"""A lone replica's network made ready before its job (the docker backend's network holders):
the home's controller keeps one holder asleep on the solo network, a BASIC job's replica joins
it instead of having the engine set up a network at its start, and once that replica is removed
the holder serves the next lone replica, which finds nothing the last one left; the
controller's sweep removes holders nothing uses."""

from __future__ import annotations

import contextlib
import uuid

from docker.errors import NotFound

from aiptrain.backends.docker import DockerBackend
from aiptrain.backends.holders import HOLDER_ROLE
from aiptrain.planning import LONE_HOSTNAME
from aiptrain.settings import Settings

from conftest import job_resources, stop_controller, wait_for
from test_gcs_endpoint import PROBE, package, stage, submit

# What each trainer here ends with: wait for the test to look at its container (a file in the job dir).
WAIT_FOR_GO = """
    go = pathlib.Path(sys.argv[sys.argv.index("--job-dir") + 1]) / "go"
    deadline = time.time() + 120
    while not go.exists() and time.time() < deadline:
        time.sleep(0.1)
"""

# Reads gs:// through the storage endpoint, says its hostname and whether TF_CONFIG's address
# of it resolves, then waits for the test to look at its container (a file in the job dir).
LOOKED_AT = PROBE + """
    import json, os, pathlib, socket, sys, time

    [address] = next(iter(json.loads(os.environ["TF_CONFIG"])["cluster"].values()))
    host = address.split(":")[0]
    print("hostname", socket.gethostname(), "resolves", bool(socket.gethostbyname(host)), flush=True)
""" + WAIT_FOR_GO

# Leaves a process listening in its network, detached in a session of its own, then waits for
# the test as LOOKED_AT does.
LEAVES = """
    import pathlib, subprocess, sys, time

    subprocess.Popen([sys.executable, "-c", "import socket, time; s = socket.socket(); "
                      "s.bind(('127.0.0.1', 7001)); s.listen(); print('listening', flush=True); time.sleep(600)"],
                     start_new_session=True)
    time.sleep(1)
    print("left a listener", flush=True)
    try:  # the holder's /etc/hosts is every replica's that joins it: root's, never a replica's user's
        with open("/etc/hosts", "a") as hosts:
            hosts.write("203.0.113.7 storage.googleapis.com\\n")
        print("WROTE the holder's hosts file", flush=True)
    except OSError as exc:
        print("hosts not written:", type(exc).__name__, flush=True)
""" + WAIT_FOR_GO

# Looks for what the replica before it in the same network left, then waits for the test.
LOOKS = """
    import pathlib, socket, sys, time

    try:
        socket.create_connection(("127.0.0.1", 7001), timeout=3)
        print("FOUND the last job's listener", flush=True)
    except OSError as exc:
        print("nothing left:", type(exc).__name__, flush=True)
    print("hosts", "changed" if "203.0.113.7" in open("/etc/hosts").read() else "as made", flush=True)
""" + WAIT_FOR_GO


def holders(docker_api, settings: Settings) -> list[dict]:
    owner = f"aiptrain.installation={settings.installation_id}"
    return docker_api.containers(all=True, filters={"label": [owner, f"aiptrain.role={HOLDER_ROLE}"]})


def test_a_lone_replica_joins_the_network_made_ready_for_it_which_then_serves_the_next_one_clean(
    cli, gcs_home, minimal_runtime, tmp_path, docker_api
):
    stage(gcs_home, tmp_path, "probe-data", {"hello.txt": "hello from the host\n"})
    trainer = package(tmp_path, "probe", task=PROBE, looked=LOOKED_AT, leaves=LEAVES, looks=LOOKS)
    settings = Settings()
    first = submit(cli, f"first_{uuid.uuid4().hex[:6]}", trainer, runtime=minimal_runtime)
    assert first.returncode == 0, first.stderr[-3000:]
    [ready] = wait_for(lambda: running_holders(docker_api, settings), timeout=60,
                       what="a network holder made ready after the first lone job")

    second = run_until_looked_at(cli, docker_api, "second", trainer, "trainer.looked", tmp_path, minimal_runtime,
                                 ready, then=lambda: None)
    assert "read hello from the host" in second and f"hostname {LONE_HOSTNAME} resolves True" in second, second[-3000:]

    # The holder serves the next lone replica (the pool's newest first: the one made while the
    # second job ran is older), and that replica finds nothing the last one left in the network.
    def another_ready() -> None:
        wait_for(lambda: [h for h in running_holders(docker_api, settings) if h["Id"] != ready["Id"]], timeout=60,
                 what="another holder made ready while the job runs")

    third = run_until_looked_at(cli, docker_api, "third", trainer, "trainer.leaves", tmp_path, minimal_runtime,
                                ready, then=another_ready)
    assert "left a listener" in third and "hosts not written: PermissionError" in third, third[-3000:]
    assert ready["Id"] in {h["Id"] for h in running_holders(docker_api, settings)}, "the holder went back to the pool"
    fourth = run_until_looked_at(cli, docker_api, "fourth", trainer, "trainer.looks", tmp_path, minimal_runtime,
                                 ready, then=lambda: None)
    assert "nothing left: ConnectionRefusedError" in fourth and "FOUND" not in fourth, fourth[-3000:]
    assert "hosts as made" in fourth, fourth[-3000:]

    stop_controller(gcs_home)  # none stays once the controller goes
    assert holders(docker_api, settings) == []


def running_holders(docker_api, settings: Settings) -> list[dict]:
    return [h for h in holders(docker_api, settings) if h["State"] == "running"]


def run_until_looked_at(cli, docker_api, name: str, trainer, module: str, tmp_path, runtime: str, holder: dict,
                        then) -> str:
    """Submit a lone job whose replica waits for the test; check that it runs in `holder`'s
    network with the lone replicas' hostname, do `then()`, let it end; its log."""
    job_id = f"{name}_{uuid.uuid4().hex[:6]}"
    job_dir = tmp_path / f"{name}-out"
    started = submit(cli, job_id, trainer, "--job-dir", str(job_dir), runtime=runtime, module=module, stream=False)
    assert started.returncode == 0, started.stderr
    [replica] = wait_for(lambda: docker_api.containers(filters={"label": f"aiptrain.job-id={job_id}"}), timeout=60,
                         what=f"the {name} job's replica to run")
    info = docker_api.inspect_container(replica["Id"])
    assert info["HostConfig"]["NetworkMode"] == f"container:{holder['Id']}"
    assert info["Config"]["Hostname"] == LONE_HOSTNAME
    then()
    (job_dir / "go").write_text("")
    streamed = cli("jobs", "stream-logs", job_id, timeout=120)
    assert cli("jobs", "describe", job_id).stdout.count("state: SUCCEEDED") == 1
    wait_for(lambda: job_resources(docker_api, job_id) == [], timeout=60, what=f"the {name} job's replica to go")
    return streamed.stdout + streamed.stderr


def test_the_sweep_removes_the_homes_holders_no_replica_uses(home, minimal_runtime, docker_api):
    """What a controller killed between a holder's make and its use left: removed by the next
    controller's sweep (at its start and hourly). A holder a replica still runs in stays."""
    settings = Settings()
    backend = DockerBackend(settings.installation_id, client=docker_api, home=str(home))
    labels = {"aiptrain.installation": settings.installation_id, "aiptrain.home": str(home),
              "aiptrain.role": HOLDER_ROLE}
    made = []
    try:
        for _ in range(2):
            made.append(docker_api.create_container("aiptrain/runtime:minimal", command=["sleep", "60"],
                                                    labels=labels)["Id"])
            docker_api.start(made[-1])
        idle, used = made
        made.append(docker_api.create_container(
            "aiptrain/runtime:minimal", command=["sleep", "60"], labels={"aiptrain.installation": settings.installation_id},
            host_config=docker_api.create_host_config(network_mode=f"container:{used}"))["Id"])
        docker_api.start(made[-1])
        backend.installation.remove_abandoned()
        assert {h["Id"] for h in holders(docker_api, settings)} == {used}
    finally:
        for container in reversed(made):
            with contextlib.suppress(NotFound):
                docker_api.remove_container(container, force=True)

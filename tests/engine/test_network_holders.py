"""A lone replica's network made ready before its job (the docker backend's network holders):
the home's controller keeps one holder asleep on the solo network, a BASIC job's replica joins
it instead of having the engine set up a network at its start, and the holder goes with that
replica; the controller's sweep removes holders nothing uses."""

from __future__ import annotations

import contextlib
import uuid

from docker.errors import NotFound

from aiptrain.backends.docker import DockerBackend
from aiptrain.backends.networks import HOLDER_ROLE
from aiptrain.planning import LONE_HOSTNAME
from aiptrain.settings import Settings

from conftest import job_resources, stop_controller, wait_for
from test_gcs_endpoint import PROBE, package, stage, submit

# Reads gs:// through the storage endpoint, says its hostname and whether TF_CONFIG's address
# of it resolves, then waits for the test to look at its container (a file in the job dir).
LOOKED_AT = PROBE + """
    import json, os, pathlib, socket, sys, time

    [address] = next(iter(json.loads(os.environ["TF_CONFIG"])["cluster"].values()))
    host = address.split(":")[0]
    print("hostname", socket.gethostname(), "resolves", bool(socket.gethostbyname(host)), flush=True)
    go = pathlib.Path(sys.argv[sys.argv.index("--job-dir") + 1]) / "go"
    deadline = time.time() + 120
    while not go.exists() and time.time() < deadline:
        time.sleep(0.1)
"""


def holders(docker_api, settings: Settings) -> list[dict]:
    owner = f"aiptrain.installation={settings.installation_id}"
    return docker_api.containers(all=True, filters={"label": [owner, f"aiptrain.role={HOLDER_ROLE}"]})


def test_a_lone_replica_joins_the_network_made_ready_for_it_which_goes_with_it(
    cli, gcs_home, minimal_runtime, tmp_path, docker_api
):
    stage(gcs_home, tmp_path, "probe-data", {"hello.txt": "hello from the host\n"})
    trainer = package(tmp_path, "probe", task=PROBE, looked=LOOKED_AT)
    settings = Settings()
    first = submit(cli, f"first_{uuid.uuid4().hex[:6]}", trainer, runtime=minimal_runtime)
    assert first.returncode == 0, first.stderr[-3000:]
    [ready] = wait_for(lambda: [h for h in holders(docker_api, settings) if h["State"] == "running"], timeout=60,
                       what="a network holder made ready after the first lone job")

    job_id = f"second_{uuid.uuid4().hex[:6]}"
    job_dir = tmp_path / "second-out"
    started = submit(cli, job_id, trainer, "--job-dir", str(job_dir), runtime=minimal_runtime,
                     module="trainer.looked", stream=False)
    assert started.returncode == 0, started.stderr
    [replica] = wait_for(lambda: docker_api.containers(filters={"label": f"aiptrain.job-id={job_id}"}), timeout=60,
                         what="the second job's replica to run")
    info = docker_api.inspect_container(replica["Id"])
    assert info["HostConfig"]["NetworkMode"] == f"container:{ready['Id']}"
    assert info["Config"]["Hostname"] == LONE_HOSTNAME
    (job_dir / "go").write_text("")
    streamed = cli("jobs", "stream-logs", job_id, timeout=120)
    logs = streamed.stdout + streamed.stderr
    assert "read hello from the host" in logs and f"hostname {LONE_HOSTNAME} resolves True" in logs, logs[-3000:]
    assert cli("jobs", "describe", job_id).stdout.count("state: SUCCEEDED") == 1
    assert job_resources(docker_api, job_id) == []

    # Its holder went with it, and the next one is ready; none stays once the controller goes.
    def next_holder() -> list[dict]:
        return [h for h in holders(docker_api, settings) if h["Id"] != ready["Id"] and h["State"] == "running"]

    wait_for(lambda: next_holder() and all(h["Id"] != ready["Id"] for h in holders(docker_api, settings)),
             timeout=60, what="the used holder to go and the next one to be ready")
    stop_controller(gcs_home)
    assert holders(docker_api, settings) == []


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

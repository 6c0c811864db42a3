"""Vertex AI's replica contract on a Docker Swarm: the probes of tests/engine/test_vertex_contract.py
(pools 0-3 as chief/worker/ps/evaluator with CLUSTER_SPEC's workerpoolN names, the project's
buckets under /gcs; every replica restarted with a killed worker) with the server's jobs run as
swarm services (AIPTRAIN_BACKEND=swarm), created by the real SDK; and a job of two pools created,
followed and streamed by the real gcloud."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from aiptrain.settings import Settings

from conftest import require_image
from test_real_gcloud import configured_gcloud, serving
from test_real_gcloud_vertex import create, stream_logs, wait_for
from test_swarm import on_swarm as on_swarm  # noqa: F401 - fixtures: this engine as a swarm manager
from test_swarm import swarm as swarm  # noqa: F401
from test_swarm import swarm_resources
from test_vertex_contract import MINIMAL, POOLS, PROJECT, RESTARTER, check_cluster_spec, job_key, pool, sdk, seen


@pytest.fixture
def swarm_server(on_swarm, gcs_home, monkeypatch):  # noqa: F811
    monkeypatch.setenv("AIPTRAIN_BACKEND", "swarm")  # the server's jobs, and its controller's
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", PROJECT)
    require_image(on_swarm, MINIMAL)
    with serving() as url:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
        yield url


def test_every_pool_sees_its_contract_on_swarm(swarm_server, on_swarm):  # noqa: F811
    aiplatform = sdk(swarm_server)
    job = aiplatform.CustomJob(
        display_name="pools-on-swarm",
        worker_pool_specs=[pool(MINIMAL, POOLS, args=("4",)), pool(MINIMAL, POOLS), pool(MINIMAL, POOLS),
                           pool(MINIMAL, POOLS)],
        base_output_dir=f"gs://{PROJECT}-b/out",
    )
    job.run(sync=True)
    assert job.state.name == "JOB_STATE_SUCCEEDED"
    seen_by = seen(f"{PROJECT}-b", "pools")
    check_cluster_spec(seen_by, {"workerpool0": 1, "workerpool1": 1, "workerpool2": 1, "workerpool3": 1}, job.name)
    types = {name: json.loads(replica["env"]["TF_CONFIG"])["task"]["type"] for name, replica in seen_by.items()}
    assert types == {"workerpool0-0": "chief", "workerpool1-0": "worker", "workerpool2-0": "ps",
                     "workerpool3-0": "evaluator"}
    assert all(replica["gcs"] == [f"{PROJECT}-b"] for replica in seen_by.values())
    assert swarm_resources(on_swarm, job_key(job)) == []


def test_a_killed_worker_restarts_every_service_of_the_job_on_swarm(swarm_server, on_swarm):  # noqa: F811
    aiplatform = sdk(swarm_server)
    job = aiplatform.CustomJob(display_name="restart-on-swarm",
                               worker_pool_specs=[pool(MINIMAL, RESTARTER), pool(MINIMAL, RESTARTER)],
                               base_output_dir=f"gs://{PROJECT}-b/out")
    job.run(sync=True, restart_job_on_worker_restart=True)
    assert job.state.name == "JOB_STATE_SUCCEEDED"
    starts = Settings().gcs_root / f"{PROJECT}-b" / "starts"
    assert (starts / "workerpool0-0").read_text().count("started") == 2
    assert (starts / "workerpool1-0").read_text().count("started") == 2
    assert swarm_resources(on_swarm, job_key(job)) == []


def test_gcloud_creates_a_job_of_two_pools_on_swarm_and_streams_each_task(swarm_server, on_swarm, tmp_path):  # noqa: F811
    gcloud = configured_gcloud(swarm_server, tmp_path, project=PROJECT)
    hello = "--worker-pool-spec=machine-type=n1-standard-4,replica-count=1,container-image-uri=" + MINIMAL
    say = "import os;print('hello from '+os.environ['CLOUD_ML_JOB_ID'])"  # gcloud splits --args at commas
    _, numeric = create(gcloud, "--display-name", "gcloud-on-swarm", hello, hello, "--command=python3,-c",
                        f"--args={say}")
    job = wait_for(gcloud, numeric)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    lines = [line[2:] for line in stream_logs(gcloud, numeric)]
    assert ["workerpool0-0", f"hello from {numeric}"] in lines and ["workerpool1-0", f"hello from {numeric}"] in lines, lines
    assert swarm_resources(on_swarm, job_key(SimpleNamespace(project=PROJECT, name=numeric))) == []

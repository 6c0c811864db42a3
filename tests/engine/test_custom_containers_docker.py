"""Custom-container jobs run their image on the real engine."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from aiptrain.settings import Settings

from conftest import job_resources, require_image

PROBE = r'''
import json, os, sys, time

args = sys.argv[1:]
spec = json.loads(os.environ["CLUSTER_SPEC"])
print("ARGV " + json.dumps(args))
print("CLUSTER_SPEC " + json.dumps(spec, sort_keys=True))
print("TF_CONFIG_TASK " + json.dumps(json.loads(os.environ["TF_CONFIG"])["task"], sort_keys=True))
if "--exit" in args:
    sys.exit(int(args[args.index("--exit") + 1]))
task = f"{spec['task']['type']}-{spec['task']['index']}"
if "--job-dir" in args:
    job_dir = args[args.index("--job-dir") + 1]
    with open(os.path.join(job_dir, task + ".json"), "w") as out:
        json.dump(args, out)
    # The master's exit ends the job and stops the others: let every worker have its say first.
    if "--wait-for-workers" in args and spec["task"]["type"] == "master":
        workers = [f"worker-{i}.json" for i in range(len(spec["cluster"].get("worker", [])))]
        for _ in range(1200):
            if all(os.path.exists(os.path.join(job_dir, name)) for name in workers):
                break
            time.sleep(0.1)
        else:
            sys.exit("the workers never wrote their files")
'''


# A relative ENTRYPOINT, as many images have: it only works from the image's WORKDIR.
DOCKERFILE = """\
FROM {base}
WORKDIR /opt/probe
COPY probe.py probe.py
ENTRYPOINT ["python3", "probe.py"]
CMD ["--from-image-cmd"]
"""


@pytest.fixture(scope="module")
def probe_image(docker_api, tmp_path_factory):
    """An image whose ENTRYPOINT prints its argv and cluster, built from the local base image."""
    base = Settings().base_image
    require_image(docker_api, base)
    context = tmp_path_factory.mktemp("probe-image")
    (context / "probe.py").write_text(PROBE)
    (context / "Dockerfile").write_text(DOCKERFILE.format(base=base))
    tag = f"aiptrain-test/custom-probe:{uuid.uuid4().hex[:12]}"
    for chunk in docker_api.build(path=str(context), tag=tag, rm=True, forcerm=True, decode=True):
        assert "error" not in chunk, chunk["error"]
    yield tag
    docker_api.remove_image(tag, force=True)


def unique_job_id(name: str) -> str:
    # Container names are global on the engine: tests running side by side must not collide.
    return f"{name}_{uuid.uuid4().hex[:8]}"


def replica_lines(stderr: str, task: str, prefix: str) -> list[str]:
    """The messages of `task` that start with `prefix`, from gcloud-format log lines."""
    found = []
    for line in stderr.splitlines():
        fields = line.split("\t")
        if len(fields) == 5 and fields[2] == task and fields[4].startswith(prefix):
            found.append(fields[4][len(prefix):])
    return found


def logged_json(stderr: str, task: str, prefix: str):
    lines = replica_lines(stderr, task, prefix)
    assert len(lines) == 1, (task, prefix, stderr)
    return json.loads(lines[0])


def test_custom_container_jobs_run_the_image(cli, docker_api, probe_image, tmp_path):
    # 1. Flags: user args and --job-dir reach the image's ENTRYPOINT on master and worker.
    job_id = unique_job_id("custom_flags")
    job_dir = str(tmp_path / "flags-out")
    result = cli(
        "jobs", "submit", "training", job_id, "--master-image-uri", probe_image, "--region", "us-central1",
        "--scale-tier", "custom", "--master-machine-type", "n1-standard-4",
        "--worker-machine-type", "n1-standard-4", "--worker-count", "1",
        "--job-dir", job_dir, "--stream-logs", "--", "--epochs", "2", "--wait-for-workers",
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    args = ["--epochs", "2", "--wait-for-workers", "--job-dir", job_dir]
    master_host = f"{job_id.lower().replace('_', '-')}-master-0:2222"
    for task, task_type in (("master-replica-0", "master"), ("worker-replica-0", "worker")):
        assert logged_json(result.stderr, task, "ARGV ") == args
        cluster_spec = logged_json(result.stderr, task, "CLUSTER_SPEC ")
        assert cluster_spec["cluster"]["master"] == [master_host]
        assert cluster_spec["task"] == {"type": task_type, "index": 0}
        assert json.loads((Path(job_dir) / f"{task_type}-0.json").read_text()) == args
    assert job_resources(docker_api, job_id) == []

    # 2. --config: containerCommand replaces the ENTRYPOINT, containerArgs the CMD; a command
    # alone (the worker's) runs without the image's CMD.
    job_id = unique_job_id("custom_config")
    job_dir = str(tmp_path / "config-out")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {
        "scaleTier": "CUSTOM", "masterType": "n1-standard-4", "workerType": "n1-standard-4", "workerCount": 1,
        "masterConfig": {
            "imageUri": probe_image,
            "containerCommand": ["python3", "probe.py", "--from-command"],
            "containerArgs": ["--job-dir", job_dir, "--wait-for-workers"],
        },
        "workerConfig": {"containerCommand": ["python3", "probe.py", "--job-dir", job_dir]},
    }}))
    result = cli("jobs", "submit", "training", job_id, "--config", str(config), "--job-dir", job_dir,
                 "--region", "us-central1", "--stream-logs")
    assert result.returncode == 0, result.stderr
    assert logged_json(result.stderr, "master-replica-0", "ARGV ") == [
        "--from-command", "--job-dir", job_dir, "--wait-for-workers"
    ]
    assert logged_json(result.stderr, "worker-replica-0", "ARGV ") == ["--job-dir", job_dir]
    assert job_resources(docker_api, job_id) == []

    # 3. A non-zero exit of the image fails the job with AI Platform's message.
    job_id = unique_job_id("custom_fails")
    result = cli("jobs", "submit", "training", job_id, "--master-image-uri", probe_image,
                 "--region", "us-central1", "--stream-logs", "--", "--exit", "3")
    assert result.returncode == 1, result.stderr
    described = cli("jobs", "describe", job_id, check_code=0)
    job = yaml.safe_load(described.stdout)
    assert job["state"] == "FAILED"
    assert "The replica master 0 exited with a non-zero status of 3." in job["errorMessage"]
    assert job_resources(docker_api, job_id) == []

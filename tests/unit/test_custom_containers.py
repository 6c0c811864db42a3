"""Custom containers (--master-image-uri, ReplicaConfig.containerCommand/containerArgs).

The planning tests are pure and compare whole ContainerSpec values; the Docker tests
build a small image from the base image (nothing is pulled) and run real jobs in it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from aiptrain.config import SubmitFlags
from aiptrain.errors import ValidationError
from aiptrain.planning import ContainerSpec, LaunchPlan, Mount, PlanInputs, plan
from aiptrain.settings import Settings
from aiptrain.submission import Submission, prepare

from conftest import job_resources, require_image

IMAGE = "example.com/trainer:1"
JOB_DIR = "/data/out"
# A master and one worker, both n1-standard-4 (15 GB, so shm is capped at half the host's 8 GB).
CUSTOM_FLAGS = {
    "scale_tier": "custom",
    "master_machine_type": "n1-standard-4",
    "worker_machine_type": "n1-standard-4",
    "worker_count": 1,
}


def submission(tmp_path: Path, config: dict | None = None, **flags) -> Submission:
    """prepare() over flags and an optional --config mapping; pure apart from reading the config file."""
    config_path = None
    if config is not None:
        config_path = tmp_path / "config.yaml"
        config_path.write_text(yaml.safe_dump(config))
    flags.setdefault("region", "us-central1")
    flags = SubmitFlags(job_id="cc_job", config=str(config_path) if config_path else None, **flags)
    return prepare(flags, Settings(home=tmp_path / "home"))


def launch_plan(sub: Submission) -> LaunchPlan:
    inputs = PlanInputs(runtime_image=sub.runtime_image, job_dir_mount=sub.job_dir_mount, user="1000:1000",
                        host_cpus=2, host_memory_bytes=8 << 30)
    return plan(sub.job, sub.replicas, inputs)


def launch_specs(sub: Submission) -> tuple[ContainerSpec, ...]:
    return launch_plan(sub).containers


def expected_spec(sub: Submission, task_type: str, image: str, entrypoint, command, mounts=()) -> ContainerSpec:
    """The whole spec of replica 0 of `task_type` in a custom-container job."""
    return ContainerSpec(
        name=f"cc_job-{task_type}-0",
        hostname=f"cc-job-{task_type}-0",
        task_name=f"{task_type}-replica-0",
        task_type=task_type,
        task_index=0,
        image=image,
        entrypoint=entrypoint,
        command=command,
        env={
            "PYTHONUNBUFFERED": "1",
            "HOME": "/tmp",
            "PYTHONUSERBASE": "/tmp/.local",
        },
        mounts=tuple(mounts),
        labels={
            "aiptrain.job-id": "cc_job",
            "aiptrain.task-name": f"{task_type}-replica-0",
            "aiptrain.task-type": task_type,
            "aiptrain.task-index": "0",
        },
        user="1000:1000",
        gpus=0,
        nano_cpus=None,
        memory_bytes=None,
        shm_bytes=4 << 30,
        working_dir=None,  # the image's WORKDIR
    )


# -- planning (pure) -----------------------------------------------------------------------


def test_user_args_and_job_dir_go_to_the_image_entrypoint_and_workers_get_the_master_image(tmp_path):
    job_dir = str(tmp_path / "out")
    sub = submission(tmp_path, master_image_uri=IMAGE, job_dir=job_dir, user_args=["--epochs", "2"], **CUSTOM_FLAGS)
    command = ["--epochs", "2", "--job-dir", job_dir]
    mounts = [Mount(job_dir, job_dir, read_only=False)]
    assert launch_specs(sub) == (
        expected_spec(sub, "master", IMAGE, None, command, mounts),
        expected_spec(sub, "worker", IMAGE, None, command, mounts),
    )


def test_a_custom_container_needs_no_module_package_or_runtime(tmp_path):
    sub = submission(tmp_path, master_image_uri=IMAGE)
    assert sub.runtime_image is None and sub.job.training_input.runtime_version is None
    # No args and no job dir: an empty command, so the image's own CMD applies (`docker run IMAGE`).
    assert launch_specs(sub) == (expected_spec(sub, "master", IMAGE, None, []),)


def test_worker_and_parameter_server_images_override_the_master_image(tmp_path):
    sub = submission(
        tmp_path, master_image_uri=IMAGE, worker_image_uri="example.com/worker:2",
        parameter_server_image_uri="example.com/ps:3", parameter_server_machine_type="n1-standard-4",
        parameter_server_count=1, **CUSTOM_FLAGS,
    )
    assert [(spec.task_name, spec.image) for spec in launch_specs(sub)] == [
        ("master-replica-0", IMAGE),
        ("worker-replica-0", "example.com/worker:2"),
        ("ps-replica-0", "example.com/ps:3"),
    ]


def test_container_command_and_args_from_config_are_the_whole_command_line(tmp_path):
    config = {"trainingInput": {
        "masterConfig": {"imageUri": IMAGE, "containerCommand": ["python3", "/app/run.py"],
                         "containerArgs": ["--lr", "0.1"]},
        "workerConfig": {"containerArgs": ["--role", "worker"]},
    }}
    sub = submission(tmp_path, config, job_dir=str(tmp_path / "out"), **CUSTOM_FLAGS)
    mounts = [Mount(str(tmp_path / "out"), str(tmp_path / "out"), read_only=False)]
    # --job-dir is added to user args only: containerArgs are used as written.
    assert launch_specs(sub) == (
        expected_spec(sub, "master", IMAGE, ["python3", "/app/run.py"], ["--lr", "0.1"], mounts),
        expected_spec(sub, "worker", IMAGE, None, ["--role", "worker"], mounts),
    )


def test_container_command_alone_runs_without_the_image_cmd(tmp_path):
    config = {"trainingInput": {"masterConfig": {"imageUri": IMAGE, "containerCommand": ["/bin/run"]}}}
    sub = submission(tmp_path, config)
    assert launch_specs(sub) == (expected_spec(sub, "master", IMAGE, ["/bin/run"], []),)


def test_container_fields_are_per_replica_type_and_only_the_image_is_inherited(tmp_path):
    config = {"trainingInput": {"masterConfig": {"imageUri": IMAGE, "containerCommand": ["/bin/run"]}}}
    sub = submission(tmp_path, config, job_dir=str(tmp_path / "out"), **CUSTOM_FLAGS)
    worker = launch_specs(sub)[1]
    assert (worker.image, worker.entrypoint, worker.command) == (IMAGE, None, ["--job-dir", str(tmp_path / "out")])


def test_cluster_spec_names_the_primary_master_and_tf_config_follows_use_chief(tmp_path):
    def env_of(sub, task_name):
        launch = launch_plan(sub)
        env = launch.environment(next(s for s in launch.containers if s.task_name == task_name))
        return json.loads(env["CLUSTER_SPEC"]), json.loads(env["TF_CONFIG"])

    sub = submission(tmp_path, master_image_uri=IMAGE, **CUSTOM_FLAGS)
    cluster_spec, tf_config = env_of(sub, "worker-replica-0")
    assert cluster_spec["cluster"] == {"master": ["cc-job-master-0:2222"], "worker": ["cc-job-worker-0:2222"]}
    assert cluster_spec["task"] == {"type": "worker", "index": 0}
    assert tf_config["cluster"] == cluster_spec["cluster"]  # custom containers say `master` by default

    chief = submission(tmp_path, master_image_uri=IMAGE, use_chief_in_tf_config=True, **CUSTOM_FLAGS)
    cluster_spec, tf_config = env_of(chief, "master-replica-0")
    assert cluster_spec["task"] == {"type": "master", "index": 0}
    assert (tf_config["task"], list(tf_config["cluster"])) == ({"type": "chief", "index": 0}, ["chief", "worker"])


# -- validation (pure) ---------------------------------------------------------------------


def rejection(tmp_path, config=None, **flags) -> str:
    with pytest.raises(ValidationError) as error:
        submission(tmp_path, config, **flags)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_image_and_runtime_version_are_mutually_exclusive_with_gclouds_message(tmp_path):
    message = rejection(tmp_path, master_image_uri=IMAGE, runtime_version="2.11")
    assert message == "Only one of --master-image-uri, --runtime-version can be set."
    from_config = {"trainingInput": {"runtimeVersion": "2.11"}}
    assert rejection(tmp_path, from_config, master_image_uri=IMAGE) == message


def test_user_args_cannot_be_combined_with_container_args(tmp_path):
    config = {"trainingInput": {"masterConfig": {"imageUri": IMAGE, "containerArgs": ["--lr", "0.1"]}}}
    message = rejection(tmp_path, config, user_args=["--epochs", "2"])
    assert "cannot be combined with masterConfig.containerCommand or containerArgs" in message


def test_container_fields_need_a_master_image(tmp_path):
    config = {"trainingInput": {"workerConfig": {"containerCommand": ["/bin/run"]}}}
    message = rejection(tmp_path, config, module_name="trainer.task", packages=[])
    assert message == "workerConfig.containerCommand and containerArgs need a custom container: set --master-image-uri."


def test_a_worker_image_needs_a_master_image(tmp_path):
    message = rejection(tmp_path, worker_image_uri=IMAGE, module_name="trainer.task", **CUSTOM_FLAGS)
    assert message == "--worker-image-uri needs --master-image-uri: set the master's image too."


# -- real containers -----------------------------------------------------------------------

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


@pytest.mark.docker
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

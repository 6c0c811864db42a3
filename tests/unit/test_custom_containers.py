"""Custom containers (--master-image-uri, ReplicaConfig.containerCommand/containerArgs).

The planning tests are pure and compare whole ContainerSpec values; the Docker tests
build a small image from the base image (nothing is pulled) and run real jobs in it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from aiptrain.config import SubmitFlags
from aiptrain.errors import ValidationError
from aiptrain.planning import LONE_HOSTNAME, ContainerSpec, LaunchPlan, Mount, PlanInputs, plan
from aiptrain.settings import Settings
from aiptrain.submission import Submission, prepare

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


def expected_spec(sub: Submission, task_type: str, image: str, entrypoint, command, mounts=(),
                  lone: bool = False) -> ContainerSpec:
    """The whole spec of replica 0 of `task_type` in a custom-container job (`lone`: its only replica)."""
    return ContainerSpec(
        name=f"cc_job-{task_type}-0",
        hostname=LONE_HOSTNAME if lone else f"cc-job-{task_type}-0",
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
    assert launch_specs(sub) == (expected_spec(sub, "master", IMAGE, None, [], lone=True),)


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
    assert launch_specs(sub) == (expected_spec(sub, "master", IMAGE, ["/bin/run"], [], lone=True),)


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



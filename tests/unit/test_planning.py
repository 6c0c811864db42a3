"""Planning is pure: whole plan values are compared, no Docker needed."""

import json

import pytest

from aiptrain.model import Job, ScaleTier, TrainingInput
from aiptrain.planning import BOOTSTRAP, ClusterConfig, ContainerSpec, LaunchPlan, Mount, NetworkSpec, PlanInputs, plan
from aiptrain.topology import replicas_for


def make_job(**training_input) -> Job:
    defaults = {"python_module": "trainer.task", "args": ["--steps", "5"], "job_dir": "/data/out",
               "region": "us-central1", "runtime_version": "2.11", "package_uris": ["file:///b/x/trainer-0.0.0.tar.gz"]}
    return Job(job_id="my_job", training_input=TrainingInput(**{**defaults, **training_input}))


INPUTS = PlanInputs(
    runtime_image="aiptrain/runtime:2.11",
    package_files=("trainer-0.0.0.tar.gz",),
    package_dir="/home/u/.local/share/aiptrain/work/my_job/packages",
    job_dir_mount="/data/out",
    user="1000:1000",
    host_cpus=8,
    host_memory_bytes=32 << 30,
)


def test_basic_plan_is_one_whole_value():
    job = make_job()
    launch = plan(job, replicas_for(job.training_input), INPUTS)
    job_dict = job.training_input.model_dump(mode="json", exclude_none=True)
    # A lone replica's hostname is the same in every job (planning.LONE_HOSTNAME).
    assert launch == LaunchPlan(
        job_id="my_job",
        network=None,  # one replica: the installation's network for lone replicas
        containers=(
            ContainerSpec(
                name="my_job-master-0",
                hostname="master-replica-0",
                task_name="master-replica-0",
                task_type="master",
                task_index=0,
                image="aiptrain/runtime:2.11",
                entrypoint=None,
                command=["sh", "-c", BOOTSTRAP, "trainer.task", "--steps", "5", "--job-dir", "/data/out"],
                env={
                    "PYTHONUNBUFFERED": "1",
                    "HOME": "/tmp",
                    "PYTHONUSERBASE": "/tmp/.local",
                    "AIPTRAIN_PACKAGES": "/opt/aiptrain/packages/trainer-0.0.0.tar.gz",
                },
                mounts=(
                    Mount(INPUTS.package_dir, "/opt/aiptrain/packages", read_only=True),
                    Mount("/data/out", "/data/out", read_only=False),
                ),
                labels={
                    "aiptrain.job-id": "my_job",
                    "aiptrain.task-name": "master-replica-0",
                    "aiptrain.task-type": "master",
                    "aiptrain.task-index": "0",
                },
                user="1000:1000",
                gpus=0,
                nano_cpus=None,
                memory_bytes=None,
                shm_bytes=15 << 30,
            ),
        ),
        cluster=ClusterConfig(
            primary="chief",
            tf_config_cluster={"chief": ["master-replica-0:2222"]},
            cluster_spec_cluster={"master": ["master-replica-0:2222"]},
            job=job_dict,
            primary_host="master-replica-0",
            workers=0,
        ),
    )
    tf_config = {
        "cluster": {"chief": ["master-replica-0:2222"]},
        "task": {"type": "chief", "index": 0},
        "job": job_dict,
        "environment": "cloud",
    }
    cluster_spec = {**tf_config, "cluster": {"master": ["master-replica-0:2222"]}, "task": {"type": "master", "index": 0}}
    env = launch.environment(launch.containers[0])
    assert (env["TF_CONFIG"], env["CLUSTER_SPEC"]) == (json.dumps(tf_config), json.dumps(cluster_spec))
    assert {k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")} == {
        "MASTER_ADDR": "master-replica-0", "MASTER_PORT": "2222", "WORLD_SIZE": "1", "RANK": "0"}


def tf_configs(launch):
    return {c.task_name: json.loads(launch.environment(c)["TF_CONFIG"]) for c in launch.containers}


def test_standard_1_cluster_and_tasks():
    job = make_job(scale_tier=ScaleTier.STANDARD_1)
    configs = tf_configs(plan(job, replicas_for(job.training_input), INPUTS))
    assert list(configs) == ["master-replica-0"] + [f"worker-replica-{i}" for i in range(4)] + [
        f"ps-replica-{i}" for i in range(3)
    ]
    expected_cluster = {
        "chief": ["my-job-master-0:2222"],
        "worker": [f"my-job-worker-{i}:2222" for i in range(4)],
        "ps": [f"my-job-ps-{i}:2222" for i in range(3)],
    }
    for config in configs.values():
        assert config["cluster"] == expected_cluster  # identical on every replica
        assert config["environment"] == "cloud"
    assert configs["worker-replica-2"]["task"] == {"type": "worker", "index": 2}
    assert configs["ps-replica-1"]["task"] == {"type": "ps", "index": 1}


def test_replicas_that_must_find_each_other_get_a_network_of_their_own():
    job = make_job(scale_tier=ScaleTier.STANDARD_1)
    network = plan(job, replicas_for(job.training_input), INPUTS).network
    assert network == NetworkSpec(name="aiptrain-my_job", labels={"aiptrain.job-id": "my_job"}, addresses=8)
    basic = make_job()
    assert plan(basic, replicas_for(basic.training_input), INPUTS).network is None


def test_evaluators_are_not_in_the_tf_config_cluster_but_are_in_cluster_spec():
    job = make_job(scale_tier="CUSTOM", master_type="n1-standard-4", evaluator_type="n1-standard-4", evaluator_count=1)
    launch = plan(job, replicas_for(job.training_input), INPUTS)
    env = launch.environment(launch.containers[-1])
    tf_config = json.loads(env["TF_CONFIG"])
    assert tf_config["cluster"] == {"chief": ["my-job-master-0:2222"]}
    assert tf_config["task"] == {"type": "evaluator", "index": 0}
    assert json.loads(env["CLUSTER_SPEC"])["cluster"]["evaluator"] == ["my-job-evaluator-0:2222"]


def test_master_for_old_runtimes_and_custom_containers_without_use_chief():
    old = make_job(runtime_version="1.15")
    assert tf_configs(plan(old, replicas_for(old.training_input), INPUTS))["master-replica-0"]["cluster"] == {
        "master": ["master-replica-0:2222"]
    }
    forced = make_job(runtime_version="1.15", use_chief_in_tf_config=True)
    assert "chief" in tf_configs(plan(forced, replicas_for(forced.training_input), INPUTS))["master-replica-0"]["cluster"]


def test_resource_limits_scale_machine_types_to_the_host():
    job = make_job(scale_tier=ScaleTier.STANDARD_1)  # 5 x 8 vCPUs + 3 x 4 vCPUs = 52 vCPUs
    limited = PlanInputs(**{**INPUTS.__dict__, "limit_resources": True, "host_cpus": 13})
    launch = plan(job, replicas_for(job.training_input), limited)
    master, ps = launch.containers[0], launch.containers[-1]
    assert master.nano_cpus == 2 * 10**9 and ps.nano_cpus == 1 * 10**9
    job_memory_gb = 5 * 7.2 + 3 * 15  # 81 GB wanted, 32 GiB here: every replica gets 32/81 of its size
    assert master.memory_bytes == pytest.approx(7.2 * (1 << 30) * 32 / job_memory_gb, rel=1e-6)
    assert master.shm_bytes == master.memory_bytes


def test_gpu_requests_follow_accelerators():
    job = make_job(scale_tier=ScaleTier.BASIC_GPU)
    (master,) = plan(job, replicas_for(job.training_input), INPUTS).containers
    assert master.gpus == 1


def test_dry_run_form_masks_secrets():
    job = make_job()
    inputs = PlanInputs(**{**INPUTS.__dict__, "extra_env": {"MY_API_KEY": "hunter2", "PLAIN": "visible"}})
    printed = plan(job, replicas_for(job.training_input), inputs).to_dict()
    env = printed["containers"][0]["env"]
    assert env["MY_API_KEY"] == "*****" and env["PLAIN"] == "visible"


def test_gs_kept_locally_reaches_replicas_through_the_endpoint_unchanged_and_survives_a_tuning_save():
    from aiptrain.planning import inputs_from_dict, inputs_to_dict
    from aiptrain.storage.endpoint import REPLICA_TOOLS, REPLICA_TRUST, StorageEndpoint

    endpoint = StorageEndpoint(gcs_root="/h/gcs", tls_dir="/h/storage-endpoint", user="65534:65534",
                               installation="abcdef0123456789", images=("aiptrain/runtime:2.11", "aiptrain/base:bookworm"))
    inputs = PlanInputs(runtime_image="aiptrain/runtime:2.11", package_files=("t.tar.gz",), package_dir="/p",
                        gcs_root="/h/gcs", gcs_endpoint=endpoint)
    job = make_job(job_dir="gs://bkt/out", args=["--data", "gs://bkt/in/train.csv"])
    launch = plan(job, replicas_for(job.training_input), inputs)
    [master] = launch.containers
    assert launch.storage == endpoint and endpoint.name == "aiptrain-storage-abcdef01"
    assert master.command[-4:] == ["--data", "gs://bkt/in/train.csv", "--job-dir", "gs://bkt/out"]
    assert Mount("/h/storage-endpoint/trust.pem", REPLICA_TRUST) in master.mounts
    assert not any(m.source.startswith("/h/gcs") for m in master.mounts)  # no bucket is bind-mounted
    assert master.env["PATH"].startswith(REPLICA_TOOLS + ":") and master.env["NO_GCE_CHECK"] == "true"
    assert inputs_from_dict(json.loads(json.dumps(inputs_to_dict(inputs)))) == inputs  # a study plans trials from it

    custom = make_job(master_config={"image_uri": "gcr.io/p/image"}, python_module=None, runtime_version=None)
    [replica] = plan(custom, replicas_for(custom.training_input), inputs).containers
    assert "PATH" not in replica.env and replica.env["SSL_CERT_FILE"] == REPLICA_TRUST  # its image's PATH stays
    without = plan(job, replicas_for(job.training_input), PlanInputs(runtime_image="i", gcs_root="/h/gcs"))
    assert without.storage is None and "/h/gcs/bkt/in/train.csv" in without.containers[0].command  # inputs an earlier aiptrain recorded

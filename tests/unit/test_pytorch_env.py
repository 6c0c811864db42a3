"""PyTorch's env:// variables on every replica (issue 8 part 8): pure planning, no Docker.
tests/engine/test_pytorch_ddp.py runs a real gloo trainer that reads only them."""

import pytest

from aiptrain.model import Job, TrainingInput
from aiptrain.planning import PlanInputs, plan, pytorch_env
from aiptrain.topology import replicas_for

TORCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


@pytest.mark.parametrize(
    "task_type, index, rank",
    [("master", 0, "0"), ("worker", 0, "1"), ("worker", 2, "3"), ("ps", 0, None), ("evaluator", 1, None)],
)
def test_primary_is_rank_0_worker_i_is_rank_i_plus_1_and_others_get_no_rank(task_type, index, rank):
    env = pytorch_env("job-master-0", 2222, 3, task_type, index)
    expected = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "2222", "WORLD_SIZE": "4"}
    assert env == (expected if rank is None else {**expected, "RANK": rank})


def test_every_replica_of_a_custom_job_gets_the_same_group_and_its_own_rank():
    job = Job(
        job_id="DDP_job",
        training_input=TrainingInput(
            region="us-central1", runtime_version="2.11", python_module="trainer.task",
            package_uris=["file:///b/trainer-0.0.0.tar.gz"], scale_tier="CUSTOM",
            master_type="n1-standard-4", worker_type="n1-standard-4", worker_count=2,
            parameter_server_type="n1-standard-4", parameter_server_count=1,
            evaluator_type="n1-standard-4", evaluator_count=1,
        ),
    )
    launch = plan(job, replicas_for(job.training_input), PlanInputs(runtime_image="aiptrain/runtime:2.11"))
    seen = {c.task_name: {k: launch.environment(c).get(k) for k in TORCH_VARS} for c in launch.containers}
    group = {"MASTER_ADDR": "ddp-job-master-0", "MASTER_PORT": "2222", "WORLD_SIZE": "3"}
    assert seen == {
        "master-replica-0": {**group, "RANK": "0"},
        "worker-replica-0": {**group, "RANK": "1"},
        "worker-replica-1": {**group, "RANK": "2"},
        "ps-replica-0": {**group, "RANK": None},
        "evaluator-replica-0": {**group, "RANK": None},
    }

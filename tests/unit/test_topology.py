"""Scale tiers and machine types become replicas, validated as the service would."""

import pytest

from aiptrain.errors import ValidationError
from aiptrain.model import AcceleratorConfig, ReplicaConfig, ScaleTier, TrainingInput
from aiptrain.topology import (
    MASTER,
    MASTER_TASK,
    Accelerator,
    Replica,
    machine_type,
    normalize_scale_tier,
    parse_task_name,
    replicas_for,
    task_label,
    task_name,
)


def names(replicas):
    return [(r.task_name, r.machine.name) for r in replicas]


def test_basic_is_one_master():
    assert names(replicas_for(TrainingInput())) == [("master-replica-0", "n1-standard-4")]


def test_standard_1():
    replicas = replicas_for(TrainingInput(scale_tier=ScaleTier.STANDARD_1))
    assert names(replicas) == [("master-replica-0", "n1-highcpu-8")] + [
        (f"worker-replica-{i}", "n1-highcpu-8") for i in range(4)
    ] + [(f"ps-replica-{i}", "n1-standard-4") for i in range(3)]


def test_premium_1_counts():
    replicas = replicas_for(TrainingInput(scale_tier=ScaleTier.PREMIUM_1))
    kinds = [r.task_type for r in replicas]
    assert (kinds.count("master"), kinds.count("worker"), kinds.count("ps")) == (1, 19, 11)


def test_basic_gpu_has_one_k80():
    (master,) = replicas_for(TrainingInput(scale_tier=ScaleTier.BASIC_GPU))
    assert master.accelerator == Accelerator("NVIDIA_TESLA_K80", 1)


def test_basic_tpu_is_rejected_clearly():
    with pytest.raises(ValidationError, match="BASIC_TPU"):
        replicas_for(TrainingInput(scale_tier=ScaleTier.BASIC_TPU))


@pytest.mark.parametrize("spelling", ["standard-1", "STANDARD_1", "Standard_1"])
def test_gcloud_spellings_of_tiers(spelling):
    assert normalize_scale_tier(spelling) is ScaleTier.STANDARD_1
    assert TrainingInput(scale_tier=spelling).scale_tier is ScaleTier.STANDARD_1


def test_custom_needs_master_type_with_gclouds_message():
    with pytest.raises(ValidationError) as error:
        replicas_for(TrainingInput(scale_tier=ScaleTier.CUSTOM))
    assert str(error.value) == "--master-machine-type is required if scale-tier is set to `CUSTOM`."


def test_custom_with_workers_ps_and_evaluators():
    ti = TrainingInput(
        scale_tier="CUSTOM", master_type="n1-highcpu-16", worker_type="n1-highcpu-16", worker_count=2,
        parameter_server_type="n1-highmem-8", parameter_server_count=1,
        evaluator_type="n1-standard-4", evaluator_count=1,
    )
    assert names(replicas_for(ti)) == [
        ("master-replica-0", "n1-highcpu-16"),
        ("worker-replica-0", "n1-highcpu-16"),
        ("worker-replica-1", "n1-highcpu-16"),
        ("ps-replica-0", "n1-highmem-8"),
        ("evaluator-replica-0", "n1-standard-4"),
    ]


def test_count_without_type_is_an_error():
    with pytest.raises(ValidationError, match="--worker-machine-type is required"):
        replicas_for(TrainingInput(scale_tier="CUSTOM", master_type="standard", worker_count=2))


def test_counts_only_with_custom():
    with pytest.raises(ValidationError, match="only be used when --scale-tier is CUSTOM"):
        replicas_for(TrainingInput(scale_tier="STANDARD_1", worker_count=2, worker_type="standard"))


def test_mixing_legacy_and_compute_engine_types_is_an_error():
    ti = TrainingInput(scale_tier="CUSTOM", master_type="complex_model_m", worker_type="n1-standard-4", worker_count=1)
    with pytest.raises(ValidationError, match="mixes both"):
        replicas_for(ti)


@pytest.mark.parametrize(
    "name, vcpus, memory", [("n1-standard-8", 8, 30), ("n1-highmem-2", 2, 13), ("n1-highcpu-32", 32, 28.8),
                            ("complex_model_l", 32, 28.8), ("large_model", 8, 52)]
)
def test_machine_type_figures(name, vcpus, memory):
    machine = machine_type(name)
    assert (machine.vcpus, machine.memory_gb) == (vcpus, memory)


@pytest.mark.parametrize("name", ["n1-standard-3", "n1-highcpu-2", "e2-standard-64", "a2-highgpu-3g", "huge"])
def test_unknown_machine_types(name):
    with pytest.raises(ValidationError, match="Unknown machine type"):
        machine_type(name)


def test_accelerators_need_compute_engine_types():
    config = ReplicaConfig(accelerator_config=AcceleratorConfig(type="NVIDIA_TESLA_T4", count=2))
    ti = TrainingInput(scale_tier="CUSTOM", master_type="n1-standard-8", master_config=config)
    (master,) = replicas_for(ti)
    assert master.accelerator == Accelerator("NVIDIA_TESLA_T4", 2)
    with pytest.raises(ValidationError, match="Compute Engine machine type"):
        replicas_for(ti.model_copy(update={"master_type": "standard"}))


def test_accelerator_type_and_count_are_checked():
    bad_type = ReplicaConfig(accelerator_config=AcceleratorConfig(type="NVIDIA_GTX_1080", count=1))
    with pytest.raises(ValidationError, match="Invalid accelerator type"):
        replicas_for(TrainingInput(scale_tier="CUSTOM", master_type="n1-standard-8", master_config=bad_type))
    tpu = ReplicaConfig(accelerator_config=AcceleratorConfig(type="TPU_V2", count=8))
    with pytest.raises(ValidationError, match="TPUs cannot be emulated"):
        replicas_for(TrainingInput(scale_tier="CUSTOM", master_type="n1-standard-8", master_config=tpu))


@pytest.mark.parametrize("task_type, index, name, label", [
    ("master", 0, "master-replica-0", "master 0"),
    ("worker", 12, "worker-replica-12", "worker 12"),
    ("ps", 3, "ps-replica-3", "ps 3"),
])
def test_a_replicas_task_name_is_built_and_read_back_in_one_place(task_type, index, name, label):
    assert task_name(task_type, index) == name == Replica(task_type, index, machine_type("standard")).task_name
    assert parse_task_name(name) == (task_type, index) and task_label(name) == label
    assert task_name(MASTER, 0) == MASTER_TASK

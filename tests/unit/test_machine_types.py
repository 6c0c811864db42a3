"""Compute Engine machine families beyond N1, the GPUs A2 types come with, TPUs refused, and
machine types given without `--scale-tier custom` (the service's implied CUSTOM)."""

import pytest

from aiptrain.errors import ValidationError
from aiptrain.model import AcceleratorConfig, ReplicaConfig, ScaleTier, TrainingInput
from aiptrain.topology import Accelerator, effective_scale_tier, machine_type, replicas_for


@pytest.mark.parametrize("name, vcpus, memory_gb, gpus", [
    ("e2-standard-4", 4, 16, 0),
    ("e2-highmem-16", 16, 128, 0),
    ("e2-highcpu-32", 32, 32, 0),
    ("n2-standard-80", 80, 320, 0),
    ("n2-highmem-2", 2, 16, 0),
    ("n2-highcpu-96", 96, 96, 0),
    ("n2d-standard-224", 224, 896, 0),
    ("n2d-highmem-96", 96, 768, 0),
    ("c2-standard-30", 30, 120, 0),
    ("m1-ultramem-40", 40, 961, 0),
    ("m1-megamem-96", 96, 1433.6, 0),
    ("a2-highgpu-1g", 12, 85, 1),
    ("a2-highgpu-8g", 96, 680, 8),
    ("a2-megagpu-16g", 96, 1360, 16),
    ("n1-highcpu-96", 96, 86.4, 0),
])
def test_family_figures(name, vcpus, memory_gb, gpus):
    machine = machine_type(name)
    assert (machine.vcpus, machine.memory_gb, machine.gpus, machine.legacy) == (vcpus, memory_gb, gpus, False)


@pytest.mark.parametrize("name", ["e2-standard-64", "e2-highmem-32", "n2-highcpu-128", "c2-standard-2",
                                  "a2-highgpu-16g", "m1-ultramem-20", "n2-standard-", "t2d-standard-4"])
def test_sizes_a_family_does_not_have(name):
    with pytest.raises(ValidationError, match="Unknown machine type"):
        machine_type(name)


def test_a2_types_come_with_their_a100s():
    (master,) = replicas_for(TrainingInput(scale_tier="CUSTOM", master_type="a2-highgpu-4g"))
    assert master.accelerator == Accelerator("NVIDIA_TESLA_A100", 4)
    matching = ReplicaConfig(accelerator_config=AcceleratorConfig(type="NVIDIA_TESLA_A100", count=4))
    (master,) = replicas_for(TrainingInput(master_type="a2-highgpu-4g", master_config=matching))
    assert master.accelerator == Accelerator("NVIDIA_TESLA_A100", 4)
    other = ReplicaConfig(accelerator_config=AcceleratorConfig(type="NVIDIA_TESLA_V100", count=4))
    with pytest.raises(ValidationError, match=r"comes with 4 NVIDIA_TESLA_A100.*type=nvidia-tesla-a100,count=4"):
        replicas_for(TrainingInput(master_type="a2-highgpu-4g", master_config=other))


def test_gpus_attach_to_n1_only():
    t4 = ReplicaConfig(accelerator_config=AcceleratorConfig(type="NVIDIA_TESLA_T4", count=1))
    for name in ("e2-standard-8", "n2-standard-8", "c2-standard-8"):
        with pytest.raises(ValidationError, match="GPUs attach to N1 machine types only"):
            replicas_for(TrainingInput(master_type=name, master_config=t4))


def test_cloud_tpu_is_refused_like_basic_tpu():
    with pytest.raises(ValidationError, match="cannot emulate"):
        replicas_for(TrainingInput(scale_tier="CUSTOM", master_type="n1-standard-8", worker_type="cloud_tpu",
                                   worker_count=1))


@pytest.mark.parametrize("tier", [None, ScaleTier.BASIC])
def test_machine_types_without_a_tier_make_the_job_custom(tier):
    t4 = ReplicaConfig(accelerator_config=AcceleratorConfig(type="NVIDIA_TESLA_T4", count=2))
    ti = TrainingInput(scale_tier=tier, master_type="n1-standard-16", master_config=t4,
                       worker_type="n1-standard-8", worker_count=2)
    assert effective_scale_tier(ti) is ScaleTier.CUSTOM
    replicas = replicas_for(ti)
    assert [(r.task_name, r.machine.name) for r in replicas] == [
        ("master-replica-0", "n1-standard-16"), ("worker-replica-0", "n1-standard-8"), ("worker-replica-1", "n1-standard-8"),
    ]
    assert replicas[0].accelerator == Accelerator("NVIDIA_TESLA_T4", 2)  # never kept while the type is dropped


@pytest.mark.parametrize("tier", [ScaleTier.STANDARD_1, ScaleTier.PREMIUM_1, ScaleTier.BASIC_GPU])
def test_machine_types_with_a_fixed_tier_are_refused(tier):
    with pytest.raises(ValidationError, match=f"scale tier {tier.value} has fixed machines"):
        replicas_for(TrainingInput(scale_tier=tier, master_type="n1-standard-16"))
    with pytest.raises(ValidationError, match="--worker-count can only be used when --scale-tier is CUSTOM"):
        replicas_for(TrainingInput(scale_tier=tier, worker_type="n1-standard-8", worker_count=1))


def test_counts_or_types_with_no_master_name_what_is_missing():
    with pytest.raises(ValidationError, match="--master-machine-type is required: evaluatorType without"):
        replicas_for(TrainingInput(evaluator_count=1, evaluator_type="n1-standard-4"))
    with pytest.raises(ValidationError, match="--worker-count must be at least 0, got -1"):
        replicas_for(TrainingInput(worker_count=-1))

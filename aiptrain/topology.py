"""Scale tiers and machine types: which replicas a job has and what each one is sized as.

Pure functions over the job model (reference: aiplatform.md §1.2, §3.3, §4). The
composition of the predefined tiers follows Google's documentation of AI Platform;
the legacy machine types carry the figures of their Compute Engine equivalents.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiptrain.errors import ValidationError
from aiptrain.model import AcceleratorConfig, ReplicaConfig, ScaleTier, TrainingInput

MASTER, WORKER, PS, EVALUATOR = "master", "worker", "ps", "evaluator"
TASK_TYPES = (MASTER, WORKER, PS, EVALUATOR)
# A job's replicas share one Linux bridge, which takes at most 1024 ports; the service's
# default quotas (450 vCPUs per project) stopped far below this.
MAX_REPLICAS = 1000


@dataclass(frozen=True)
class MachineType:
    name: str
    vcpus: int
    memory_gb: float
    gpus: int = 0
    gpu_type: str | None = None
    legacy: bool = False


def _legacy(name: str, vcpus: int, memory_gb: float, gpus: int = 0, gpu: str | None = None) -> MachineType:
    return MachineType(name, vcpus, memory_gb, gpus, gpu, legacy=True)


LEGACY_MACHINE_TYPES = {
    m.name: m
    for m in (
        _legacy("standard", 4, 15),
        _legacy("large_model", 8, 52),
        _legacy("complex_model_s", 8, 7.2),
        _legacy("complex_model_m", 16, 14.4),
        _legacy("complex_model_l", 32, 28.8),
        _legacy("standard_gpu", 8, 30, 1, "NVIDIA_TESLA_K80"),
        _legacy("complex_model_m_gpu", 16, 60, 4, "NVIDIA_TESLA_K80"),
        _legacy("complex_model_l_gpu", 32, 120, 8, "NVIDIA_TESLA_K80"),
        _legacy("standard_p100", 8, 30, 1, "NVIDIA_TESLA_P100"),
        _legacy("complex_model_m_p100", 16, 60, 4, "NVIDIA_TESLA_P100"),
        _legacy("standard_v100", 8, 30, 1, "NVIDIA_TESLA_V100"),
        _legacy("large_model_v100", 8, 52, 1, "NVIDIA_TESLA_V100"),
        _legacy("complex_model_m_v100", 16, 60, 4, "NVIDIA_TESLA_V100"),
        _legacy("complex_model_l_v100", 32, 120, 8, "NVIDIA_TESLA_V100"),
    )
}

# Compute Engine N1 families the service accepts, with memory per vCPU in GB.
N1_FAMILIES = {
    "n1-standard": ((4, 8, 16, 32, 64, 96), 3.75),
    "n1-highmem": ((2, 4, 8, 16, 32, 64, 96), 6.5),
    "n1-highcpu": ((16, 32, 64, 96), 0.9),
}

ACCELERATOR_TYPES = (
    "NVIDIA_TESLA_K80",
    "NVIDIA_TESLA_P100",
    "NVIDIA_TESLA_V100",
    "NVIDIA_TESLA_P4",
    "NVIDIA_TESLA_T4",
    "NVIDIA_TESLA_A100",
    "TPU_V2",
    "TPU_V3",
    "TPU_V2_POD",
    "TPU_V3_POD",
)

# Predefined tiers: replica type -> (count, machine type). Counts and types per Google's docs.
TIER_REPLICAS: dict[ScaleTier, dict[str, tuple[int, str]]] = {
    ScaleTier.BASIC: {MASTER: (1, "n1-standard-4")},
    ScaleTier.STANDARD_1: {MASTER: (1, "n1-highcpu-8"), WORKER: (4, "n1-highcpu-8"), PS: (3, "n1-standard-4")},
    ScaleTier.PREMIUM_1: {MASTER: (1, "n1-highcpu-16"), WORKER: (19, "n1-highcpu-16"), PS: (11, "n1-highmem-8")},
    ScaleTier.BASIC_GPU: {MASTER: (1, "standard_gpu")},
}

# The predefined tiers use a few sizes outside the families users may name for CUSTOM.
_TIER_ONLY_TYPES = {"n1-highcpu-8": MachineType("n1-highcpu-8", 8, 7.2)}


def machine_type(name: str) -> MachineType:
    """Look up a machine type by the name the service accepts; unknown names are a ValidationError."""
    if name in LEGACY_MACHINE_TYPES:
        return LEGACY_MACHINE_TYPES[name]
    if name in _TIER_ONLY_TYPES:
        return _TIER_ONLY_TYPES[name]
    match = re.fullmatch(r"(n1-(?:standard|highmem|highcpu))-(\d+)", name)
    if match and match.group(1) in N1_FAMILIES:
        sizes, gb_per_vcpu = N1_FAMILIES[match.group(1)]
        vcpus = int(match.group(2))
        if vcpus in sizes:
            return MachineType(name, vcpus, round(vcpus * gb_per_vcpu, 2))
    raise ValidationError(
        f"Unknown machine type [{name}]: use a legacy type such as `standard` or `complex_model_m`, "
        "or a Compute Engine type such as `n1-standard-4`, `n1-highmem-8` or `n1-highcpu-16`."
    )


@dataclass(frozen=True)
class Accelerator:
    type: str  # enum name, e.g. NVIDIA_TESLA_T4
    count: int


@dataclass(frozen=True)
class Replica:
    """One replica of the training cluster, before it is placed anywhere."""

    task_type: str  # master | worker | ps | evaluator
    index: int
    machine: MachineType
    accelerator: Accelerator | None = None
    config: ReplicaConfig | None = None  # per-type imageUri, containerCommand/Args

    @property
    def task_name(self) -> str:
        """The name AI Platform uses in logs: master-replica-0, worker-replica-3, ..."""
        return f"{self.task_type}-replica-{self.index}"

    @property
    def display_name(self) -> str:
        """The name used in error messages: 'master 0', 'worker 1'."""
        return f"{self.task_type} {self.index}"


def normalize_scale_tier(value: str) -> ScaleTier:
    """Accept gcloud's spellings: `standard-1`, `STANDARD_1`, `Standard_1`."""
    key = value.strip().upper().replace("-", "_")
    try:
        return ScaleTier(key)
    except ValueError:
        choices = ", ".join(t.value.lower().replace("_", "-") for t in ScaleTier)
        raise ValidationError(f"Invalid --scale-tier [{value}]: choose one of {choices}.") from None


def _accelerator(config: ReplicaConfig | None, flag: str) -> Accelerator | None:
    acc: AcceleratorConfig | None = config.accelerator_config if config else None
    if acc is None or (acc.type is None and acc.count is None):
        return None
    acc_type = (acc.type or "").upper().replace("-", "_")
    if acc_type not in ACCELERATOR_TYPES:
        names = ", ".join(t.lower().replace("_", "-") for t in ACCELERATOR_TYPES)
        raise ValidationError(f"Invalid accelerator type [{acc.type}] in {flag}: choose one of {names}.")
    if acc_type.startswith("TPU"):
        raise ValidationError(f"{flag}: TPUs cannot be emulated locally; use an NVIDIA GPU type or none.")
    if acc.count is None or acc.count <= 0:
        raise ValidationError("The count of the accelerator must be greater than 0.")
    return Accelerator(acc_type, acc.count)


_GROUPS = (
    # task type, type field, count field, config field, flag prefix
    (WORKER, "worker_type", "worker_count", "worker_config", "--worker"),
    (PS, "parameter_server_type", "parameter_server_count", "parameter_server_config", "--parameter-server"),
    (EVALUATOR, "evaluator_type", "evaluator_count", "evaluator_config", "evaluator"),
)


def _custom_groups(ti: TrainingInput) -> dict[str, tuple[int, str]]:
    if not ti.master_type:
        raise ValidationError("--master-machine-type is required if scale-tier is set to `CUSTOM`.")
    groups = {MASTER: (1, ti.master_type)}
    for task_type, type_field, count_field, _, flag in _GROUPS:
        type_name, count = getattr(ti, type_field), getattr(ti, count_field)
        check_count(count, f"{flag}-count")
        if count and not type_name:
            raise ValidationError(f"{flag}-machine-type is required when {flag}-count is greater than 0.")
        if count:
            groups[task_type] = (count, type_name)
    return groups


def check_count(count: int | None, flag: str) -> None:
    """A replica count the engine can hold: checked before anything is sized by it."""
    if count is None:
        return
    if count < 0:
        raise ValidationError(f"{flag} must be at least 0, got {count}.")
    if count > MAX_REPLICAS:
        raise ValidationError(
            f"{flag} {count} is more than a job can have here: at most {MAX_REPLICAS} replicas per job "
            "(they share one Docker bridge network)."
        )


def _check_total(groups: dict[str, tuple[int, str]]) -> None:
    total = sum(count for count, _ in groups.values())
    if total > MAX_REPLICAS:
        raise ValidationError(
            f"The job has {total} replicas: at most {MAX_REPLICAS} per job (they share one Docker bridge "
            "network); lower --worker-count or --parameter-server-count."
        )


def replicas_for(ti: TrainingInput) -> list[Replica]:
    """Every replica of the job, master first, validated as the service would."""
    tier = ti.scale_tier or ScaleTier.BASIC
    if tier is ScaleTier.BASIC_TPU:
        raise ValidationError(
            "Scale tier BASIC_TPU needs a Cloud TPU, which aiptrain cannot emulate: "
            "use BASIC_GPU, BASIC or CUSTOM."
        )
    if tier is ScaleTier.CUSTOM:
        groups = _custom_groups(ti)
    else:
        for _, _, count_field, _, flag in _GROUPS:
            if getattr(ti, count_field):
                raise ValidationError(f"{flag}-count can only be used when --scale-tier is CUSTOM.")
        groups = TIER_REPLICAS[tier]
    _check_total(groups)

    machines = {task_type: machine_type(name) for task_type, (_, name) in groups.items()}
    if len({m.legacy for m in machines.values()}) > 1:
        raise ValidationError(
            "Machine types must all be legacy types (e.g. `complex_model_m`) or all Compute Engine "
            "types (e.g. `n1-highcpu-16`); this job mixes both."
        )

    configs = {MASTER: ti.master_config, **{t: getattr(ti, c) for t, _, _, c, _ in _GROUPS}}
    replicas = []
    for task_type, (count, _) in groups.items():
        config = configs[task_type]
        machine = machines[task_type]
        accelerator = _accelerator(config, f"--{task_type.replace('ps', 'parameter-server')}-accelerator")
        if accelerator and machine.legacy:
            raise ValidationError(
                f"An accelerator for the {task_type} needs a Compute Engine machine type "
                f"(e.g. n1-standard-8), not the legacy type [{machine.name}]."
            )
        if accelerator is None and machine.gpus:
            accelerator = Accelerator(machine.gpu_type or "NVIDIA_TESLA_K80", machine.gpus)
        replicas += [Replica(task_type, i, machine, accelerator, config) for i in range(count)]
    return replicas

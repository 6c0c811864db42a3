"""Scale tiers and machine types: which replicas a job has and what each one is sized as.

Pure functions over the job model (reference: aiplatform.md §1.2, §3.3, §4). The
composition of the predefined tiers follows Google's documentation of AI Platform;
the legacy machine types carry the figures of their Compute Engine equivalents.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiptrain.errors import ValidationError
from aiptrain.model import AcceleratorConfig, ReplicaConfig, ScaleTier, TrainingInput, api_enum_name, gcloud_spelling

MASTER, WORKER, PS, EVALUATOR = "master", "worker", "ps", "evaluator"
TASK_TYPES = (MASTER, WORKER, PS, EVALUATOR)
_REPLICA_INFIX = "-replica-"
# A job's replicas share one Linux bridge, which takes at most 1024 ports; the service's
# default quotas (450 vCPUs per project) stopped far below this.
MAX_REPLICAS = 1000


def task_name(task_type: str, index: int) -> str:
    """The name AI Platform gives a replica in logs and labels: master-replica-0, worker-replica-3."""
    return f"{task_type}{_REPLICA_INFIX}{index}"


def parse_task_name(name: str) -> tuple[str, int]:
    """`worker-replica-1` -> ("worker", 1), the inverse of `task_name`."""
    task_type, _, index = name.partition(_REPLICA_INFIX)
    return task_type, int(index)


def task_label(name: str) -> str:
    """`worker-replica-1` -> `worker 1`, the form AI Platform's error messages use."""
    task_type, _, index = name.partition(_REPLICA_INFIX)
    return f"{task_type} {index}"


# The primary replica: its exit ends the job, its hypertune reports are a trial's metric.
MASTER_TASK = task_name(MASTER, 0)


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

# Compute Engine families the service accepts: family -> (vCPU sizes, GB of memory per vCPU).
# N1 sizes are the service's list (reference §4.3); the later families carry Compute Engine's
# predefined sizes and ratios (compute/docs/general-purpose-machines, compute-optimized-machines).
CE_FAMILIES = {
    "n1-standard": ((4, 8, 16, 32, 64, 96), 3.75),
    "n1-highmem": ((2, 4, 8, 16, 32, 64, 96), 6.5),
    "n1-highcpu": ((16, 32, 64, 96), 0.9),
    "e2-standard": ((2, 4, 8, 16, 32), 4),
    "e2-highmem": ((2, 4, 8, 16), 8),
    "e2-highcpu": ((2, 4, 8, 16, 32), 1),
    "n2-standard": ((2, 4, 8, 16, 32, 48, 64, 80, 96, 128), 4),
    "n2-highmem": ((2, 4, 8, 16, 32, 48, 64, 80, 96, 128), 8),
    "n2-highcpu": ((2, 4, 8, 16, 32, 48, 64, 80, 96), 1),
    "n2d-standard": ((2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 224), 4),
    "n2d-highmem": ((2, 4, 8, 16, 32, 48, 64, 80, 96), 8),
    "n2d-highcpu": ((2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 224), 1),
    "c2-standard": ((4, 8, 16, 30, 60), 4),
}
# Families whose sizes do not follow one ratio, and the accelerator-optimized A2 types with
# their built-in NVIDIA A100 GPUs (compute/docs/memory-optimized-machines, gpus).
_FIXED_CE_TYPES = {
    m.name: m
    for m in (
        MachineType("m1-ultramem-40", 40, 961),
        MachineType("m1-ultramem-80", 80, 1922),
        MachineType("m1-ultramem-160", 160, 3844),
        MachineType("m1-megamem-96", 96, 1433.6),
        MachineType("a2-highgpu-1g", 12, 85, 1, "NVIDIA_TESLA_A100"),
        MachineType("a2-highgpu-2g", 24, 170, 2, "NVIDIA_TESLA_A100"),
        MachineType("a2-highgpu-4g", 48, 340, 4, "NVIDIA_TESLA_A100"),
        MachineType("a2-highgpu-8g", 96, 680, 8, "NVIDIA_TESLA_A100"),
        MachineType("a2-megagpu-16g", 96, 1360, 16, "NVIDIA_TESLA_A100"),
    )
}
# Compute Engine attaches GPUs (acceleratorConfig) to N1 machines only; A2 machines come with theirs.
GPU_FAMILY_PREFIXES = ("n1-", "a2-")
TPU_MACHINE_TYPE = "cloud_tpu"

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
    if name == TPU_MACHINE_TYPE:
        raise ValidationError(
            f"Machine type [{TPU_MACHINE_TYPE}] is a Cloud TPU, which aiptrain cannot emulate: "
            "use a CPU or GPU machine type such as `n1-standard-8` with an NVIDIA accelerator."
        )
    known = LEGACY_MACHINE_TYPES.get(name) or _TIER_ONLY_TYPES.get(name) or _FIXED_CE_TYPES.get(name)
    if known:
        return known
    family, _, size = name.rpartition("-")
    if family in CE_FAMILIES and size.isdigit():
        sizes, gb_per_vcpu = CE_FAMILIES[family]
        if int(size) in sizes:
            return MachineType(name, int(size), round(int(size) * gb_per_vcpu, 2))
    raise ValidationError(
        f"Unknown machine type [{name}]: use a legacy type such as `standard` or `complex_model_m`, "
        "or a Compute Engine type such as `n1-standard-4`, `e2-highmem-8`, `n2-standard-16` or `a2-highgpu-1g` "
        "(docs/guide/submit.md lists them all)."
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
        return task_name(self.task_type, self.index)


def normalize_scale_tier(value: str) -> ScaleTier:
    """Accept gcloud's spellings: `standard-1`, `STANDARD_1`, `Standard_1` (no blanks: gcloud's
    choices and the API's enum names have none)."""
    try:
        return ScaleTier(api_enum_name(value))
    except ValueError:
        raise ValidationError(f"Invalid --scale-tier [{value}]: choose one of {scale_tier_choices()}.") from None


def scale_tier_choices() -> str:
    return ", ".join(gcloud_spelling(t.value) for t in ScaleTier)


def _accelerator(config: ReplicaConfig | None, flag: str) -> Accelerator | None:
    acc: AcceleratorConfig | None = config.accelerator_config if config else None
    if acc is None or (acc.type is None and acc.count is None):
        return None
    acc_type = api_enum_name(acc.type or "")
    if acc_type not in ACCELERATOR_TYPES:
        names = ", ".join(gcloud_spelling(t) for t in ACCELERATOR_TYPES)
        raise ValidationError(f"Invalid accelerator type [{acc.type}] in {flag}: choose one of {names}.")
    if acc_type.startswith("TPU"):
        raise ValidationError(f"{flag}: TPUs cannot be emulated locally; use an NVIDIA GPU type or none.")
    if acc.count is None or acc.count <= 0:
        raise ValidationError("The count of the accelerator must be greater than 0.")
    return Accelerator(acc_type, acc.count)


def _machine_accelerator(task_type: str, machine: MachineType, given: Accelerator | None) -> Accelerator | None:
    """The GPUs a replica gets: those its machine type comes with, or those attached to it,
    which Compute Engine allows on N1 machines only."""
    built_in = Accelerator(machine.gpu_type or "NVIDIA_TESLA_K80", machine.gpus) if machine.gpus else None
    if given is None:
        return built_in
    if machine.legacy:
        raise ValidationError(
            f"An accelerator for the {task_type} needs a Compute Engine machine type "
            f"(e.g. n1-standard-8), not the legacy type [{machine.name}]."
        )
    if built_in:
        if given != built_in:
            raise ValidationError(
                f"Machine type [{machine.name}] comes with {built_in.count} {built_in.type}: set the "
                f"{task_type}'s accelerator to `type={gcloud_spelling(built_in.type)},count={built_in.count}` or leave it out."
            )
        return built_in
    if not machine.name.startswith(GPU_FAMILY_PREFIXES):
        raise ValidationError(
            f"GPUs attach to N1 machine types only: give the {task_type} an n1-* type "
            f"instead of [{machine.name}], or an a2-* type (A100 GPUs built in)."
        )
    return given


@dataclass(frozen=True)
class _Group:
    """A replica type's fields in TrainingInput and the names users know them by (evaluators
    have no flags: they come from --config only)."""

    task_type: str
    field_prefix: str  # worker -> worker_type, worker_count, worker_config
    type_name: str
    count_name: str
    accelerator_name: str


_MASTER_GROUP = _Group(MASTER, "master", "--master-machine-type", "", "--master-accelerator")
_GROUPS = (
    _Group(WORKER, "worker", "--worker-machine-type", "--worker-count", "--worker-accelerator"),
    _Group(PS, "parameter_server", "--parameter-server-machine-type", "--parameter-server-count",
           "--parameter-server-accelerator"),
    _Group(EVALUATOR, "evaluator", "evaluatorType", "evaluatorCount", "evaluatorConfig.acceleratorConfig"),
)
# Fields that describe a custom cluster, and the names users know them by.
_CUSTOM_FIELDS = (("master_type", _MASTER_GROUP.type_name),) + tuple(
    pair for g in _GROUPS for pair in ((f"{g.field_prefix}_type", g.type_name), (f"{g.field_prefix}_count", g.count_name))
)


def effective_scale_tier(ti: TrainingInput) -> ScaleTier:
    """The tier the service would run. BASIC is the proto's zero value, so an absent tier and an
    explicit BASIC are one and the same to the service; either, with a machine type or a
    replica count given, is CUSTOM (the service reads the machine types rather than drop them
    while keeping their GPUs). Other predefined tiers fix their own machines: a machine type
    or count given with one is refused rather than silently ignored."""
    for field, flag in _CUSTOM_FIELDS:
        count = getattr(ti, field)
        if field.endswith("_count") and count is not None and count < 0:
            raise ValidationError(f"{flag} must be at least 0, got {count}.")
    tier = ti.scale_tier or ScaleTier.BASIC
    given = [flag for field, flag in _CUSTOM_FIELDS if getattr(ti, field)]
    if tier is ScaleTier.BASIC and given:
        if not ti.master_type:
            raise ValidationError(
                f"--master-machine-type is required: {given[0]} without --scale-tier (or with basic) "
                "makes the job CUSTOM, whose master needs a machine type."
            )
        return ScaleTier.CUSTOM
    if tier is not ScaleTier.CUSTOM and given:
        counts = [flag for flag in given if flag.endswith(("-count", "Count"))]
        if counts:
            raise ValidationError(f"{counts[0]} can only be used when --scale-tier is CUSTOM.")
        raise ValidationError(
            f"{given[0]} can only be used with --scale-tier custom (or no --scale-tier): scale tier "
            f"{tier.value} has fixed machines; drop {given[0]} or use --scale-tier custom."
        )
    return tier


def _custom_groups(ti: TrainingInput) -> dict[str, tuple[int, str]]:
    if not ti.master_type:
        raise ValidationError("--master-machine-type is required if scale-tier is set to `CUSTOM`.")
    groups = {MASTER: (1, ti.master_type)}
    for group in _GROUPS:
        type_name, count = getattr(ti, f"{group.field_prefix}_type"), getattr(ti, f"{group.field_prefix}_count")
        check_count(count, group.count_name)
        if count and not type_name:
            raise ValidationError(f"{group.type_name} is required when {group.count_name} is greater than 0.")
        if type_name and count is None:  # gcloud's flags come as a pair; a type alone runs nothing
            raise ValidationError(
                f"{group.type_name} is given without {group.count_name}: give both (how many replicas of that "
                "type), or neither."
            )
        if count:
            groups[group.task_type] = (count, type_name)
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
    tier = effective_scale_tier(ti)
    if tier is ScaleTier.BASIC_TPU:
        raise ValidationError(
            "Scale tier BASIC_TPU needs a Cloud TPU, which aiptrain cannot emulate: "
            "use BASIC_GPU, BASIC or CUSTOM."
        )
    groups = _custom_groups(ti) if tier is ScaleTier.CUSTOM else TIER_REPLICAS[tier]
    _check_total(groups)

    machines = {task_type: machine_type(name) for task_type, (_, name) in groups.items()}
    if len({m.legacy for m in machines.values()}) > 1:
        raise ValidationError(
            "Machine types must all be legacy types (e.g. `complex_model_m`) or all Compute Engine "
            "types (e.g. `n1-highcpu-16`); this job mixes both."
        )

    by_type = {g.task_type: g for g in (_MASTER_GROUP, *_GROUPS)}
    replicas = []
    for task_type, (count, _) in groups.items():
        group = by_type[task_type]
        config = getattr(ti, f"{group.field_prefix}_config")
        machine = machines[task_type]
        accelerator = _accelerator(config, group.accelerator_name)
        accelerator = _machine_accelerator(task_type, machine, accelerator)
        replicas += [Replica(task_type, i, machine, accelerator, config) for i in range(count)]
    return replicas

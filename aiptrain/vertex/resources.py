"""The aiplatform v1 resources of custom training as pydantic models: camelCase on the wire,
enums taken as names or as the integers the SDK's REST transport sends
(`$alt=json;enum-encoding=int`), int64 fields taken as JSON strings or numbers and written as
strings, as the service answers. Pure data: no I/O here.

Field lists follow googleapis google/cloud/aiplatform/v1/{custom_job,machine_resources,
hyperparameter_tuning_job,study,job_state,accelerator_type}.proto; fields aiptrain records
but does not act on are typed loosely and returned as sent."""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer
from pydantic.alias_generators import to_camel

from aiptrain.model import Int64, Timestamp


class VertexMessage(BaseModel):
    """Base of the messages: unknown fields refused, as the service's JSON parser refuses them."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_resource(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _proto_enum(enum_type: type[enum.Enum]) -> Any:
    """An enum field as the REST transports send it: its name, or its number."""

    def parse(value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"must be one of {', '.join(enum_type.__members__)}")
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            number = int(value)
            for member in enum_type:
                if member.value == number:
                    return member
            raise ValueError(f"[{value}] is not a value of {enum_type.__name__}")
        if isinstance(value, str):
            name = value.strip().upper()
            if name in enum_type.__members__:
                return enum_type[name]
            raise ValueError(f"[{value}] is not one of {', '.join(enum_type.__members__)}")
        return value

    return Annotated[enum_type, BeforeValidator(parse), PlainSerializer(lambda m: m.name, return_type=str)]


class JobState(enum.IntEnum):
    JOB_STATE_UNSPECIFIED = 0
    JOB_STATE_QUEUED = 1
    JOB_STATE_PENDING = 2
    JOB_STATE_RUNNING = 3
    JOB_STATE_SUCCEEDED = 4
    JOB_STATE_FAILED = 5
    JOB_STATE_CANCELLING = 6
    JOB_STATE_CANCELLED = 7
    JOB_STATE_PAUSED = 8
    JOB_STATE_EXPIRED = 9
    JOB_STATE_UPDATING = 10
    JOB_STATE_PARTIALLY_SUCCEEDED = 11


class AcceleratorType(enum.IntEnum):
    ACCELERATOR_TYPE_UNSPECIFIED = 0
    NVIDIA_TESLA_K80 = 1
    NVIDIA_TESLA_P100 = 2
    NVIDIA_TESLA_V100 = 3
    NVIDIA_TESLA_P4 = 4
    NVIDIA_TESLA_T4 = 5
    TPU_V2 = 6
    TPU_V3 = 7
    NVIDIA_TESLA_A100 = 8
    NVIDIA_A100_80GB = 9
    TPU_V4_POD = 10
    NVIDIA_L4 = 11
    TPU_V5_LITEPOD = 12
    NVIDIA_H100_80GB = 13
    NVIDIA_H100_MEGA_80GB = 14
    NVIDIA_H200_141GB = 15
    NVIDIA_B200 = 16
    NVIDIA_GB200 = 17
    NVIDIA_RTX_PRO_6000 = 18


class Strategy(enum.IntEnum):
    STRATEGY_UNSPECIFIED = 0
    ON_DEMAND = 1
    LOW_COST = 2
    STANDARD = 3
    SPOT = 4
    FLEX_START = 6


class EnvVar(VertexMessage):
    name: str
    value: str = ""


class ContainerSpec(VertexMessage):
    image_uri: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = None


class PythonPackageSpec(VertexMessage):
    executor_image_uri: str | None = None
    package_uris: list[str] | None = None
    python_module: str | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = None


class MachineSpec(VertexMessage):
    machine_type: str | None = None
    accelerator_type: _proto_enum(AcceleratorType) | None = None  # type: ignore[valid-type]
    accelerator_count: int | None = None
    gpu_partition_size: str | None = None
    tpu_topology: str | None = None
    reservation_affinity: dict[str, Any] | None = None


class DiskSpec(VertexMessage):
    boot_disk_type: str | None = None
    boot_disk_size_gb: int | None = None


class WorkerPoolSpec(VertexMessage):
    container_spec: ContainerSpec | None = None
    python_package_spec: PythonPackageSpec | None = None
    machine_spec: MachineSpec | None = None
    replica_count: Int64 | None = None
    nfs_mounts: list[dict[str, Any]] | None = None
    lustre_mounts: list[dict[str, Any]] | None = None
    disk_spec: DiskSpec | None = None

    @property
    def is_placeholder(self) -> bool:
        """An empty pool (`{}`), which keeps the later pools' numbers."""
        return self.container_spec is None and self.python_package_spec is None and not self.replica_count


class Scheduling(VertexMessage):
    timeout: str | None = None  # a Duration: "7200s"
    restart_job_on_worker_restart: bool | None = None
    strategy: _proto_enum(Strategy) | None = None  # type: ignore[valid-type]
    disable_retries: bool | None = None
    max_wait_duration: str | None = None


class GcsDestination(VertexMessage):
    output_uri_prefix: str | None = None


class CustomJobSpec(VertexMessage):
    persistent_resource_id: str | None = None
    worker_pool_specs: list[WorkerPoolSpec] | None = None
    scheduling: Scheduling | None = None
    service_account: str | None = None
    network: str | None = None
    reserved_ip_ranges: list[str] | None = None
    psc_interface_config: dict[str, Any] | None = None
    base_output_directory: GcsDestination | None = None
    protected_artifact_location_id: str | None = None
    tensorboard: str | None = None
    enable_web_access: bool | None = None
    enable_dashboard_access: bool | None = None
    experiment: str | None = None
    experiment_run: str | None = None
    models: list[str] | None = None


class Status(VertexMessage):
    """google.rpc.Status: what a failed or cancelled job carries as `error`."""

    code: int = 0
    message: str = ""
    details: list[dict[str, Any]] | None = None


class CustomJob(VertexMessage):
    name: str | None = None
    display_name: str | None = None
    job_spec: CustomJobSpec | None = None
    state: _proto_enum(JobState) | None = None  # type: ignore[valid-type]
    create_time: Timestamp | None = None
    start_time: Timestamp | None = None
    end_time: Timestamp | None = None
    update_time: Timestamp | None = None
    error: Status | None = None
    labels: dict[str, str] | None = None
    encryption_spec: dict[str, Any] | None = None
    web_access_uris: dict[str, str] | None = None
    satisfies_pzs: bool | None = None
    satisfies_pzi: bool | None = None


# -- hyperparameter tuning ----------------------------------------------------------------------

class GoalType(enum.IntEnum):
    GOAL_TYPE_UNSPECIFIED = 0
    MAXIMIZE = 1
    MINIMIZE = 2


class ScaleType(enum.IntEnum):
    SCALE_TYPE_UNSPECIFIED = 0
    UNIT_LINEAR_SCALE = 1
    UNIT_LOG_SCALE = 2
    UNIT_REVERSE_LOG_SCALE = 3


class Algorithm(enum.IntEnum):
    ALGORITHM_UNSPECIFIED = 0
    GRID_SEARCH = 2
    RANDOM_SEARCH = 3


class MeasurementSelectionType(enum.IntEnum):
    MEASUREMENT_SELECTION_TYPE_UNSPECIFIED = 0
    LAST_MEASUREMENT = 1
    BEST_MEASUREMENT = 2


class ObservationNoise(enum.IntEnum):
    OBSERVATION_NOISE_UNSPECIFIED = 0
    LOW = 1
    HIGH = 2


class TrialState(enum.IntEnum):
    STATE_UNSPECIFIED = 0
    REQUESTED = 1
    ACTIVE = 2
    STOPPING = 3
    SUCCEEDED = 4
    INFEASIBLE = 5


class MetricSpec(VertexMessage):
    metric_id: str | None = None
    goal: _proto_enum(GoalType) | None = None  # type: ignore[valid-type]
    safety_config: dict[str, Any] | None = None


class DoubleValueSpec(VertexMessage):
    min_value: float | None = None
    max_value: float | None = None
    default_value: float | None = None


class IntegerValueSpec(VertexMessage):
    min_value: Int64 | None = None
    max_value: Int64 | None = None
    default_value: Int64 | None = None


class CategoricalValueSpec(VertexMessage):
    values: list[str] | None = None
    default_value: str | None = None


class DiscreteValueSpec(VertexMessage):
    values: list[float] | None = None
    default_value: float | None = None


class ValuesCondition(VertexMessage):
    values: list[Any] | None = None


class ConditionalParameterSpec(VertexMessage):
    parameter_spec: ParameterSpec | None = None
    parent_discrete_values: ValuesCondition | None = None
    parent_int_values: ValuesCondition | None = None
    parent_categorical_values: ValuesCondition | None = None


class ParameterSpec(VertexMessage):
    parameter_id: str | None = None
    double_value_spec: DoubleValueSpec | None = None
    integer_value_spec: IntegerValueSpec | None = None
    categorical_value_spec: CategoricalValueSpec | None = None
    discrete_value_spec: DiscreteValueSpec | None = None
    scale_type: _proto_enum(ScaleType) | None = None  # type: ignore[valid-type]
    conditional_parameter_specs: list[ConditionalParameterSpec] | None = None


ConditionalParameterSpec.model_rebuild()


class StudySpec(VertexMessage):
    metrics: list[MetricSpec] | None = None
    parameters: list[ParameterSpec] | None = None
    algorithm: _proto_enum(Algorithm) | None = None  # type: ignore[valid-type]
    observation_noise: _proto_enum(ObservationNoise) | None = None  # type: ignore[valid-type]
    measurement_selection_type: _proto_enum(MeasurementSelectionType) | None = None  # type: ignore[valid-type]
    decay_curve_stopping_spec: dict[str, Any] | None = None
    median_automated_stopping_spec: dict[str, Any] | None = None
    convex_automated_stopping_spec: dict[str, Any] | None = None
    study_stopping_config: dict[str, Any] | None = None

    @property
    def stops_early(self) -> bool:
        return self.decay_curve_stopping_spec is not None or self.median_automated_stopping_spec is not None


class MeasurementMetric(VertexMessage):
    metric_id: str
    value: float


class Measurement(VertexMessage):
    elapsed_duration: str | None = None
    step_count: Int64 | None = None
    metrics: list[MeasurementMetric] = Field(default_factory=list)


class TrialParameter(VertexMessage):
    parameter_id: str
    value: Any


class Trial(VertexMessage):
    name: str | None = None
    id: str
    state: _proto_enum(TrialState) | None = None  # type: ignore[valid-type]
    parameters: list[TrialParameter] = Field(default_factory=list)
    final_measurement: Measurement | None = None
    measurements: list[Measurement] | None = None
    start_time: Timestamp | None = None
    end_time: Timestamp | None = None
    custom_job: str | None = None
    infeasible_reason: str | None = None
    web_access_uris: dict[str, str] | None = None


class HyperparameterTuningJob(VertexMessage):
    name: str | None = None
    display_name: str | None = None
    study_spec: StudySpec | None = None
    max_trial_count: int | None = None
    parallel_trial_count: int | None = None
    max_failed_trial_count: int | None = None
    trial_job_spec: CustomJobSpec | None = None
    trials: list[Trial] | None = None
    state: _proto_enum(JobState) | None = None  # type: ignore[valid-type]
    create_time: Timestamp | None = None
    start_time: Timestamp | None = None
    end_time: Timestamp | None = None
    update_time: Timestamp | None = None
    error: Status | None = None
    labels: dict[str, str] | None = None
    encryption_spec: dict[str, Any] | None = None
    satisfies_pzs: bool | None = None
    satisfies_pzi: bool | None = None

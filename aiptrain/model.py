"""The Job resource of ml.googleapis.com/v1, as pydantic models.

Field names are snake_case in Python and camelCase on the wire (aliases), so
`job.to_resource()` prints what `gcloud ai-platform jobs describe` prints, and a
`--config` YAML written for gcloud loads unchanged. int64 fields are strings on
the wire, as in the REST representation. Pure data: no I/O here.
"""

from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, field_validator
from pydantic.alias_generators import to_camel

# REST int64 values are JSON strings ("workerCount: '4'"); YAML ints are accepted on input.
Int64 = Annotated[int, PlainSerializer(str, return_type=str, when_used="json")]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def rfc3339(moment: datetime) -> str:
    """RFC 3339 in UTC with a Z, as the service prints times."""
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


Timestamp = Annotated[datetime, PlainSerializer(rfc3339, return_type=str, when_used="json")]


class Resource(BaseModel):
    """Base for REST messages: camelCase aliases, unknown fields rejected like gcloud's decoder."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_resource(self) -> dict[str, Any]:
        """The REST representation: camelCase keys, unset fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class State(str, enum.Enum):
    STATE_UNSPECIFIED = "STATE_UNSPECIFIED"
    QUEUED = "QUEUED"
    PREPARING = "PREPARING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})


class ScaleTier(str, enum.Enum):
    BASIC = "BASIC"
    STANDARD_1 = "STANDARD_1"
    PREMIUM_1 = "PREMIUM_1"
    BASIC_GPU = "BASIC_GPU"
    BASIC_TPU = "BASIC_TPU"
    CUSTOM = "CUSTOM"


class AcceleratorConfig(Resource):
    count: Int64 | None = None
    type: str | None = None  # enum name, e.g. NVIDIA_TESLA_T4


class DiskConfig(Resource):
    boot_disk_type: str | None = None
    boot_disk_size_gb: int | None = None


class ReplicaConfig(Resource):
    accelerator_config: AcceleratorConfig | None = None
    image_uri: str | None = None
    container_command: list[str] | None = None
    container_args: list[str] | None = None
    disk_config: DiskConfig | None = None
    tpu_tf_version: str | None = None


class Scheduling(Resource):
    max_running_time: str | None = None  # duration such as "7200s"
    max_wait_time: str | None = None
    priority: int | None = None


class EncryptionConfig(Resource):
    kms_key_name: str | None = None


class TrainingInput(Resource):
    scale_tier: ScaleTier | None = None
    master_type: str | None = None
    master_config: ReplicaConfig | None = None
    worker_type: str | None = None
    worker_count: Int64 | None = None
    worker_config: ReplicaConfig | None = None
    parameter_server_type: str | None = None
    parameter_server_count: Int64 | None = None
    parameter_server_config: ReplicaConfig | None = None
    evaluator_type: str | None = None
    evaluator_count: Int64 | None = None
    evaluator_config: ReplicaConfig | None = None
    package_uris: list[str] | None = None
    python_module: str | None = None
    args: list[str] | None = None
    hyperparameters: dict[str, Any] | None = None
    region: str | None = None
    job_dir: str | None = None
    runtime_version: str | None = None
    python_version: str | None = None
    use_chief_in_tf_config: bool | None = None
    scheduling: Scheduling | None = None
    service_account: str | None = None
    network: str | None = None
    encryption_config: EncryptionConfig | None = None
    enable_web_access: bool | None = None

    @field_validator("scale_tier", mode="before")
    @classmethod
    def _normalize_scale_tier(cls, value: Any) -> Any:
        # gcloud's spellings (`standard-1`) as well as the enum names (`STANDARD_1`).
        return value.strip().upper().replace("-", "_") if isinstance(value, str) else value

    @property
    def uses_custom_container(self) -> bool:
        return bool(self.master_config and self.master_config.image_uri)


class TrainingOutput(Resource):
    completed_trial_count: Int64 | None = None
    trials: list[dict[str, Any]] | None = None
    consumed_ml_units: float | None = None
    is_hyperparameter_tuning_job: bool | None = None
    hyperparameter_metric_tag: str | None = None
    web_access_uris: dict[str, str] | None = None


class Job(Resource):
    job_id: str = ""
    labels: dict[str, str] | None = None
    training_input: TrainingInput = Field(default_factory=TrainingInput)
    training_output: TrainingOutput | None = None
    create_time: Timestamp | None = None
    start_time: Timestamp | None = None
    end_time: Timestamp | None = None
    state: State | None = None
    error_message: str | None = None
    etag: str | None = None

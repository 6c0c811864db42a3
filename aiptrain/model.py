"""The Job resource of ml.googleapis.com/v1, as pydantic models.

Field names are snake_case in Python and camelCase on the wire (aliases), so
`job.to_resource()` prints what `gcloud ai-platform jobs describe` prints, and a
`--config` YAML written for gcloud loads unchanged. int64 fields are strings on
the wire, as in the REST representation. Pure data: no I/O here.
"""

from __future__ import annotations

import collections
import enum
import functools
import math
import re
from datetime import datetime, timezone
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, field_validator, model_validator
from pydantic.alias_generators import to_camel

from aiptrain.states import ACTIVE_STATES, TERMINAL_STATES, State  # noqa: F401 - the model's own names too


# REST int64 values are JSON strings ("workerCount: '4'"); YAML ints are accepted on input.
def _not_a_boolean(value: Any) -> Any:
    # pydantic takes `true` for 1; a count written as a boolean is a mistake, not a number.
    if isinstance(value, bool):
        raise ValueError(f"must be a whole number, not {str(value).lower()}")
    return value


Int64 = Annotated[int, BeforeValidator(_not_a_boolean), PlainSerializer(str, return_type=str, when_used="json")]


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


def api_enum_name(spelling: str) -> str:
    """gcloud's spelling of an enum value (`standard-1`, `nvidia-tesla-t4`) -> the API's name
    (`STANDARD_1`, `NVIDIA_TESLA_T4`); an API name is left as it is."""
    return spelling.upper().replace("-", "_")


def gcloud_spelling(enum_name: str) -> str:
    """The API's enum name -> gcloud's spelling of it: `STANDARD_1` -> `standard-1`."""
    return enum_name.lower().replace("_", "-")


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


class FieldError(ValueError):
    """A validation failure below the field that raised it: `path` (e.g. `params[1] (lr)`) is
    appended to pydantic's location when the error is printed (config.pydantic_error_line)."""

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path


def enum_choice(value: Any, enum_type: type[enum.Enum], what: str) -> Any:
    """Enum names in any case (real configs write `maximize`); anything else names the choices."""
    if not isinstance(value, str):
        return value
    name = value.strip().upper()
    if name not in enum_type.__members__:
        choices = ", ".join(enum_type.__members__)
        raise ValueError(f"[{value}] is not {what}: use one of {choices}")
    return name


class Goal(str, enum.Enum):
    GOAL_TYPE_UNSPECIFIED = "GOAL_TYPE_UNSPECIFIED"
    MAXIMIZE = "MAXIMIZE"
    MINIMIZE = "MINIMIZE"


class ParameterType(str, enum.Enum):
    PARAMETER_TYPE_UNSPECIFIED = "PARAMETER_TYPE_UNSPECIFIED"
    DOUBLE = "DOUBLE"
    INTEGER = "INTEGER"
    CATEGORICAL = "CATEGORICAL"
    DISCRETE = "DISCRETE"


class ScaleType(str, enum.Enum):
    NONE = "NONE"
    UNIT_LINEAR_SCALE = "UNIT_LINEAR_SCALE"
    UNIT_LOG_SCALE = "UNIT_LOG_SCALE"
    UNIT_REVERSE_LOG_SCALE = "UNIT_REVERSE_LOG_SCALE"

    @property
    def is_log(self) -> bool:
        return self in (ScaleType.UNIT_LOG_SCALE, ScaleType.UNIT_REVERSE_LOG_SCALE)


class Algorithm(str, enum.Enum):
    ALGORITHM_UNSPECIFIED = "ALGORITHM_UNSPECIFIED"
    GRID_SEARCH = "GRID_SEARCH"
    RANDOM_SEARCH = "RANDOM_SEARCH"


DEFAULT_METRIC_TAG = "training/hptuning/metric"
MAX_DISCRETE_VALUES = 1000
MAX_GRID_POINTS = 100_000  # aiptrain's own bound: the grid is enumerated in memory
# aiptrain's own bounds (the service publishes none): every trial is kept in the job's resource
# (trainingOutput.trials), and every parallel trial is a set of containers on this machine (of
# which a study starts no more at once than the machine runs: aiptrain.admission.trials_at_once).
MAX_TRIALS = 1000
MAX_PARALLEL_TRIALS = 100
GRID_TYPES = (ParameterType.INTEGER, ParameterType.CATEGORICAL, ParameterType.DISCRETE)
_FLAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_T = TypeVar("_T")


def _required(value: _T | None, field: str) -> _T:
    """A field that validation requires: ValueError on a resource that skipped validation."""
    if value is None:
        raise ValueError(f"{field} is required")
    return value


class ParameterSpec(Resource):
    parameter_name: str | None = None
    type: ParameterType | None = None
    min_value: float | None = None
    max_value: float | None = None
    categorical_values: list[str] | None = None
    discrete_values: list[float] | None = None
    scale_type: ScaleType | None = None

    @field_validator("type", mode="before")
    @classmethod
    def _type_name(cls, value: Any) -> Any:
        return enum_choice(value, ParameterType, "a parameter type")

    @field_validator("scale_type", mode="before")
    @classmethod
    def _scale_name(cls, value: Any) -> Any:
        return enum_choice(value, ScaleType, "a scale type")

    @field_validator("categorical_values", mode="before")
    @classmethod
    def _categories_as_strings(cls, value: Any) -> Any:
        # YAML reads `[32, 64]` as numbers; the service takes them as the strings they spell.
        if isinstance(value, list):
            return [str(item) if isinstance(item, (int, float)) else item for item in value]
        return value

    @property
    def scale(self) -> ScaleType:
        return self.scale_type or ScaleType.NONE

    # The fields problem() requires, for a parameter that passed it (as every parameter of a
    # validated HyperparameterSpec has).
    @property
    def name(self) -> str:
        return _required(self.parameter_name, "parameterName")

    @property
    def bounds(self) -> tuple[float, float]:
        """minValue and maxValue of a DOUBLE or INTEGER parameter."""
        return _required(self.min_value, "minValue"), _required(self.max_value, "maxValue")

    @property
    def choices(self) -> list[str] | list[float]:
        """categoricalValues of a CATEGORICAL parameter, as given; discreteValues of a DISCRETE one,
        in increasing order (the resource keeps them as sent: the service took any order)."""
        if self.type is ParameterType.CATEGORICAL:
            return _required(self.categorical_values, "categoricalValues")
        return sorted(_required(self.discrete_values, "discreteValues"))

    def problem(self) -> str | None:
        """What is wrong with this parameter, as `field must ...: fix`; None when it is valid."""
        if not self.parameter_name:
            return "parameterName is required: name the flag the trial receives, e.g. learning_rate"
        if not _FLAG_NAME.fullmatch(self.parameter_name):
            return "parameterName must be a flag name (letters, digits, _ . -, not starting with a digit)"
        if self.type in (None, ParameterType.PARAMETER_TYPE_UNSPECIFIED):
            return "type is required: use one of DOUBLE, INTEGER, CATEGORICAL, DISCRETE"
        checks = {
            ParameterType.DOUBLE: self._range_problem,
            ParameterType.INTEGER: self._range_problem,
            ParameterType.CATEGORICAL: self._categorical_problem,
            ParameterType.DISCRETE: self._discrete_problem,
        }
        return checks[self.type]()

    def _range_problem(self) -> str | None:
        kind = "INTEGER" if self.type is ParameterType.INTEGER else "DOUBLE"
        if self.categorical_values is not None or self.discrete_values is not None:
            return f"{kind} takes minValue and maxValue, not categoricalValues or discreteValues"
        if self.min_value is None or self.max_value is None:
            return f"{kind} needs both minValue and maxValue"
        if not (math.isfinite(self.min_value) and math.isfinite(self.max_value)):
            return "minValue and maxValue must be finite numbers"
        if self.type is ParameterType.INTEGER and not (
            self.min_value.is_integer() and self.max_value.is_integer()
        ):
            return "INTEGER needs whole numbers for minValue and maxValue"
        if self.min_value >= self.max_value:
            return "minValue must be less than maxValue"
        if self.scale.is_log and self.min_value <= 0:
            return f"{self.scale.value} needs minValue greater than 0: use UNIT_LINEAR_SCALE or raise minValue"
        return None

    def _categorical_problem(self) -> str | None:
        if self.min_value is not None or self.max_value is not None or self.discrete_values is not None:
            return "CATEGORICAL takes categoricalValues only: remove minValue, maxValue and discreteValues"
        if self.scale_type is not None:
            return "scaleType does not apply to CATEGORICAL: remove it"
        if not self.categorical_values:
            return "CATEGORICAL needs a non-empty categoricalValues list"
        if any(not value for value in self.categorical_values):
            return "categoricalValues must not hold empty strings"
        if len(set(self.categorical_values)) != len(self.categorical_values):
            return "categoricalValues must be unique"
        return None

    def _discrete_problem(self) -> str | None:
        values = self.discrete_values
        if self.categorical_values is not None:
            return "DISCRETE takes discreteValues, not categoricalValues"
        if not values:
            return "DISCRETE needs a non-empty discreteValues list"
        if len(values) > MAX_DISCRETE_VALUES:
            return f"discreteValues holds {len(values)} values; at most {MAX_DISCRETE_VALUES} are allowed"
        if not all(math.isfinite(value) for value in values):
            return "discreteValues must be finite numbers"
        # The service took the values in any order (its tuner sorts them), but a value twice is
        # not a list of feasible points: Vizier's ParameterConfig refuses duplicates.
        repeated = sorted(value for value, count in collections.Counter(values).items() if count > 1)
        if repeated:
            shown = ", ".join(f"{value:g}" for value in repeated)
            return f"discreteValues must not repeat a value ([{shown}] more than once): list each value once"
        if self.scale.is_log and min(values) <= 0:
            return f"{self.scale.value} needs every discreteValue greater than 0"
        return None

    @property
    def grid_values(self) -> list[int] | list[str] | list[float]:
        """The points GRID_SEARCH visits for this parameter (INTEGER, CATEGORICAL, DISCRETE)."""
        if self.type is ParameterType.INTEGER:
            low, high = self.bounds
            return list(range(int(low), int(high) + 1))
        return self.choices.copy()

    @property
    def grid_size(self) -> int:
        if self.type is ParameterType.INTEGER:
            low, high = self.bounds
            return int(high) - int(low) + 1
        return len(self.choices)


# The fields of a HyperparameterSpec that define its study, which a job resuming it takes over
# when it leaves them out (HyperparameterSpec.resumed_from).
STUDY_FIELDS = ("params", "goal", "hyperparameter_metric_tag", "algorithm", "enable_trial_early_stopping")


class HyperparameterSpec(Resource):
    goal: Goal | None = None
    params: list[ParameterSpec] | None = None
    max_trials: Int64 | None = None
    max_parallel_trials: Int64 | None = None
    max_failed_trials: Int64 | None = None
    hyperparameter_metric_tag: str | None = None
    enable_trial_early_stopping: bool | None = None
    resume_previous_job_id: str | None = None
    algorithm: Algorithm | None = None

    @field_validator("goal", mode="before")
    @classmethod
    def _goal_name(cls, value: Any) -> Any:
        return enum_choice(value, Goal, "a goal")

    @field_validator("algorithm", mode="before")
    @classmethod
    def _algorithm_name(cls, value: Any) -> Any:
        return enum_choice(value, Algorithm, "an algorithm")

    @model_validator(mode="after")
    def _check(self) -> HyperparameterSpec:
        if not self.params and not self.resume_previous_job_id:
            raise FieldError("params", "at least one parameter is required: add a params list, or "
                             "resumePreviousJobId to take a previous tuning job's")
        names: set[str] = set()
        for index, param in enumerate(self.params or ()):
            where = f"params[{index}]" + (f" ({param.parameter_name})" if param.parameter_name else "")
            problem = param.problem()
            if problem is None and param.parameter_name in names:
                problem = "parameterName is used twice: give every parameter its own name"
            if problem is None and self.search is Algorithm.GRID_SEARCH and param.type not in GRID_TYPES:
                problem = "GRID_SEARCH takes INTEGER, CATEGORICAL or DISCRETE parameters: use RANDOM_SEARCH for DOUBLE"
            if problem:
                raise FieldError(where, problem)
            names.add(param.name)
        for field, least, most in (("max_trials", 1, MAX_TRIALS), ("max_parallel_trials", 1, MAX_PARALLEL_TRIALS),
                                   ("max_failed_trials", 0, MAX_TRIALS)):
            value = getattr(self, field)
            if value is not None and value < least:
                raise FieldError(to_camel(field), f"must be at least {least}")
            if value is not None and value > most:
                raise FieldError(to_camel(field), f"is {value}; aiptrain runs at most {most}: give a smaller number")
        if self.search is Algorithm.GRID_SEARCH and self.grid_size > MAX_GRID_POINTS:
            raise FieldError(
                "params", f"the grid has {self.grid_size} points; GRID_SEARCH takes at most "
                f"{MAX_GRID_POINTS}: narrow the INTEGER ranges or use RANDOM_SEARCH"
            )
        return self

    def resumed_from(self, previous: HyperparameterSpec) -> HyperparameterSpec:
        """This spec continuing `previous`'s study (resumePreviousJobId): what defines the study
        (params, goal, hyperparameterMetricTag, algorithm, enableTrialEarlyStopping) comes from
        the previous job where this spec leaves it out, as the service resumed that job's study;
        the budget (maxTrials, maxParallelTrials, maxFailedTrials) is this job's own. Validated
        again: ValueError (pydantic's) when the two do not fit together."""
        given = self.model_dump(exclude_none=True)
        taken = previous.model_dump(exclude_none=True, include=set(STUDY_FIELDS))
        if not self.params:
            given.pop("params", None)  # an empty list: nothing given
        return HyperparameterSpec.model_validate({**taken, **given})

    @property
    def effective_goal(self) -> Goal:
        return Goal.MINIMIZE if self.goal is Goal.MINIMIZE else Goal.MAXIMIZE

    @property
    def search(self) -> Algorithm:
        return self.algorithm or Algorithm.ALGORITHM_UNSPECIFIED

    @property
    def parameters(self) -> list[ParameterSpec]:
        """params, which validation requires."""
        return _required(self.params, "params")

    @property
    def trials_limit(self) -> int:
        return self.max_trials or 1

    @property
    def parallel_limit(self) -> int:
        return self.max_parallel_trials or 1

    @property
    def failed_limit(self) -> int:
        """maxFailedTrials; 0 (the default) leaves the rule to the emulator."""
        return self.max_failed_trials or 0

    @property
    def metric_tag(self) -> str:
        return self.hyperparameter_metric_tag or DEFAULT_METRIC_TAG

    @property
    def early_stopping(self) -> bool:
        return bool(self.enable_trial_early_stopping)

    @property
    def grid_size(self) -> int:
        return math.prod(param.grid_size for param in self.params or ())


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
    hyperparameters: HyperparameterSpec | None = None
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
        return api_enum_name(value.strip()) if isinstance(value, str) else value

    @property
    def uses_custom_container(self) -> bool:
        return bool(self.master_config and self.master_config.image_uri)


class Metric(Resource):
    training_step: Int64 | None = None
    objective_value: float | None = None


class BuiltInAlgorithmOutput(Resource):
    """A built-in algorithm job's: what it trained on, and (once it succeeded) where its model is."""

    framework: str | None = None  # TENSORFLOW, XGBOOST
    runtime_version: str | None = None
    python_version: str | None = None
    model_path: str | None = None  # the job's (a trial's) `<jobDir>/model/`

    def succeeded_in(self, job_dir: str | None) -> BuiltInAlgorithmOutput:
        """The output of a job (a trial) that succeeded with this --job-dir: its model's path too."""
        return self.model_copy(update={"model_path": f"{job_dir.rstrip('/')}/model/" if job_dir else None})


class HyperparameterOutput(Resource):
    """One trial of an HP job; `hyperparameters` values are strings, as the service returns them."""

    trial_id: str
    hyperparameters: dict[str, str] = Field(default_factory=dict)
    final_metric: Metric | None = None
    all_metrics: list[Metric] | None = None
    start_time: Timestamp | None = None
    end_time: Timestamp | None = None
    state: State | None = None
    is_trial_stopped_early: bool | None = None
    built_in_algorithm_output: BuiltInAlgorithmOutput | None = None  # a built-in algorithm's trial that succeeded


def trial_order(trial_id: str) -> tuple:
    """Sort key for trial ids: numerically ("2" before "10"), any other id after them."""
    return (0, int(trial_id), "") if trial_id.isdigit() else (1, 0, trial_id)


class TrainingOutput(Resource):
    completed_trial_count: Int64 | None = None
    trials: list[HyperparameterOutput] | None = None
    consumed_ml_units: float | None = Field(default=None, alias="consumedMLUnits")  # not to_camel's MlUnits
    is_hyperparameter_tuning_job: bool | None = None
    hyperparameter_metric_tag: str | None = None
    web_access_uris: dict[str, str] | None = None
    # A built-in algorithm's job (its image declares it): set at submit, modelPath once it succeeded.
    is_built_in_algorithm_job: bool | None = None
    built_in_algorithm_output: BuiltInAlgorithmOutput | None = None


@functools.cache
def training_input_names() -> frozenset[str]:
    """The names a TrainingInput field is given by: its camelCase alias and its Python name."""
    return frozenset(name for key, field in TrainingInput.model_fields.items() for name in (key, field.alias) if name)


def training_fields_lifted(data: dict) -> dict:
    """A Job body whose TrainingInput fields written at its top level (`scaleTier: CUSTOM` beside,
    not under, `trainingInput:`) are moved under trainingInput, as the service took them: gcloud
    reads such a --config file and posts those fields at the top level of the body (apitools keeps
    a message's unknown fields), and published configs were written so. A field also given under
    trainingInput keeps that value there: it is what the flags set (they override the config)."""
    names = training_input_names()
    outside = {name: value for name, value in data.items() if name in names}
    if not outside:
        return data
    key = "training_input" if "training_input" in data and "trainingInput" not in data else "trainingInput"
    inside = data.get(key)
    if not isinstance(inside, dict | None):  # refused as it is, naming trainingInput
        return data
    rest = {name: value for name, value in data.items() if name not in names}
    return {**rest, key: {**outside, **(inside or {})}}


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
    job_position: Int64 | None = None  # a QUEUED job's place in the queue (1: starts next); not stored

    @model_validator(mode="before")
    @classmethod
    def _lift_training_fields(cls, data: Any) -> Any:
        return training_fields_lifted(data) if isinstance(data, dict) else data

"""Vertex AI's trainingPipelines of the custom task, and the Models they upload. Pure: no I/O.

A TrainingPipeline whose trainingTaskDefinition is the custom task carries a CustomJobSpec in
`trainingTaskInputs`, a protobuf Value: the SDK writes its keys in snake_case (`worker_pool_specs`)
and every number as a double (`replica_count: 1.0`, `args: ["--epochs", 5.0]`). The pipeline runs
it as its backing CustomJob, a customJobs resource of its own (displayName `<pipeline>-custom-job`,
as the service named it) on the same ml v1 job. When that job succeeds, `modelToUpload` becomes a
Model whose artifacts are `<baseOutputDirectory>/model`, the AIP_MODEL_DIR the trainer wrote to:
version 1, alias `default`, named by `modelId` or a number, as the service uploaded it.

The pipeline's record keeps the TrainingPipeline as the client gave it plus what the service set
on it: `trainingTaskMetadata.backingCustomJob`, and once the job ended `modelToUpload.name` and
`versionId` (or the `error` that kept the Model from being uploaded). Its state, times and error
otherwise come from the ml v1 job, as a CustomJob's do.
"""

from __future__ import annotations

import copy
import enum
import hashlib
import re
from typing import Any

from pydantic import ValidationError as PydanticError

from aiptrain.errors import ValidationError
from aiptrain.model import Job
from aiptrain.vertex.records import MODELS, Record, resource_name
from aiptrain.vertex.resources import CustomJobSpec, VertexMessage
from aiptrain.vertex.views import error_of, job_state, times

SCHEMAS = "gs://google-cloud-aiplatform/schema/trainingjob/definition/"
CUSTOM_TASK = SCHEMAS + "custom_task_1.0.0.yaml"
TUNING_TASK = SCHEMAS + "hyperparameter_tuning_task_1.0.0.yaml"
# What the service sets on a TrainingPipeline (a resource read back and created again carries them).
OUTPUT_FIELDS = ("name", "state", "error", "createTime", "startTime", "endTime", "updateTime",
                 "trainingTaskMetadata")
# A Model's output fields, left out of a modelToUpload as given.
MODEL_OUTPUT_FIELDS = ("name", "versionId", "versionCreateTime", "versionUpdateTime", "createTime", "updateTime",
                       "trainingPipeline", "artifactUri", "deployedModels", "etag", "supportedDeploymentResourcesTypes",
                       "modelSourceInfo")
# modelId: "up to 63 characters, and valid characters are [a-z0-9_-]. The first character cannot be
# a number or hyphen" (training_pipeline.proto).
MODEL_ID = re.compile(r"[a-z_][a-z0-9_-]{0,62}")
FIRST_VERSION, DEFAULT_ALIAS = "1", "default"
MODEL_DIR = "model"  # under baseOutputDirectory: AIP_MODEL_DIR (translate.OUTPUT_ENV)
BACKING_JOB_SUFFIX = "-custom-job"
# google.rpc.Code of a pipeline whose Model could not be uploaded.
FAILED_PRECONDITION, ALREADY_EXISTS = 9, 6


class PipelineState(enum.IntEnum):
    PIPELINE_STATE_UNSPECIFIED = 0
    PIPELINE_STATE_QUEUED = 1
    PIPELINE_STATE_PENDING = 2
    PIPELINE_STATE_RUNNING = 3
    PIPELINE_STATE_SUCCEEDED = 4
    PIPELINE_STATE_FAILED = 5
    PIPELINE_STATE_CANCELLING = 6
    PIPELINE_STATE_CANCELLED = 7
    PIPELINE_STATE_PAUSED = 8


class TrainingPipeline(VertexMessage):
    """What a client gives (the output fields left out first): training_pipeline.proto."""

    display_name: str | None = None
    input_data_config: dict[str, Any] | None = None
    training_task_definition: str | None = None
    training_task_inputs: Any = None
    model_to_upload: dict[str, Any] | None = None
    model_id: str | None = None
    parent_model: str | None = None
    labels: dict[str, str] | None = None
    encryption_spec: dict[str, Any] | None = None


def without_output(body: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in body.items() if key not in OUTPUT_FIELDS}


def custom_task(pipeline: TrainingPipeline) -> CustomJobSpec:
    """The CustomJobSpec the pipeline runs; ValidationError (one line: what and what to do) for
    what the service refused or aiptrain does not run."""
    definition = pipeline.training_task_definition
    if not definition:
        raise ValidationError(f"trainingTaskDefinition is required: give the custom task, {CUSTOM_TASK}.")
    if definition == TUNING_TASK:
        raise ValidationError(f"trainingTaskDefinition [{definition}] is not served here: create a "
                              "hyperparameterTuningJob for a study, or give the custom task, " + CUSTOM_TASK + ".")
    if definition != CUSTOM_TASK:
        raise ValidationError(f"trainingTaskDefinition [{definition}] is not served here: aiptrain runs custom "
                              f"training only ({CUSTOM_TASK}); AutoML training has no equivalent on this machine.")
    if pipeline.input_data_config is not None:
        raise ValidationError("inputDataConfig (a managed dataset) is not served here: aiptrain has no Vertex AI "
                              "datasets; leave it out and have the trainer read its data from gs:// (pass the URI "
                              "as an argument).")
    if pipeline.parent_model:
        raise ValidationError(f"parentModel [{pipeline.parent_model}] is not served here: aiptrain uploads each "
                              "Model as a new model (version 1); leave parentModel out.")
    if pipeline.model_id is not None and not MODEL_ID.fullmatch(pipeline.model_id):
        raise ValidationError(f"modelId [{pipeline.model_id}] is invalid: use up to 63 of a-z, 0-9, _ and -, "
                              "starting with a letter or _.")
    _check_model_to_upload(pipeline.model_to_upload)
    inputs = pipeline.training_task_inputs
    if not isinstance(inputs, dict):
        raise ValidationError("trainingTaskInputs is required: the custom task's CustomJobSpec (workerPoolSpecs, "
                              "baseOutputDirectory, ...).")
    try:
        spec = CustomJobSpec.model_validate(_from_value(inputs))
    except PydanticError as exc:
        first = exc.errors()[0]
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"])
        raise ValidationError(f"trainingTaskInputs{where}: {first['msg'].removeprefix('Value error, ')}.") from None
    if pipeline.model_to_upload is not None and base_output_dir(spec) is None:
        raise ValidationError("trainingTaskInputs.baseOutputDirectory.outputUriPrefix is required with "
                              "modelToUpload: the Model's artifacts are what the trainer wrote to "
                              "<baseOutputDirectory>/model (AIP_MODEL_DIR).")
    return spec


def _check_model_to_upload(model: dict[str, Any] | None) -> None:
    if model is None:
        return
    if not model.get("displayName"):
        raise ValidationError("modelToUpload.displayName is required: name the Model the pipeline uploads.")
    container = model.get("containerSpec")
    if not isinstance(container, dict) or not container.get("imageUri"):
        raise ValidationError("modelToUpload.containerSpec.imageUri is required: the serving image of a custom "
                              "trained Model (e.g. us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-0:latest).")


def _from_value(value: Any, key: str = "") -> Any:
    """trainingTaskInputs as a CustomJobSpec reads it: a protobuf Value has only doubles, so whole
    numbers become ints (`replica_count: 1.0`), and numbers in `args` and `command` become the
    strings the SDK's caller meant (`["--epochs", 5.0]` -> `["--epochs", "5"]`)."""
    if isinstance(value, dict):
        return {name: _from_value(item, name) for name, item in value.items()}
    if isinstance(value, list):
        items = [_from_value(item) for item in value]
        return [str(item) if isinstance(item, (int, float)) and not isinstance(item, bool) else item
                for item in items] if key in ("args", "command") else items
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def base_output_dir(spec: CustomJobSpec) -> str | None:
    directory = spec.base_output_directory
    return directory.output_uri_prefix if directory and directory.output_uri_prefix else None


def output_dir_of(pipeline: Record) -> str:
    """The baseOutputDirectory of a recorded pipeline that has a Model to upload (checked at create)."""
    spec = CustomJobSpec.model_validate(_from_value(pipeline.body["trainingTaskInputs"]))
    return base_output_dir(spec) or ""


def artifact_uri(output_dir: str) -> str:
    """Where the Model's artifacts are: AIP_MODEL_DIR without its trailing slash."""
    return f"{output_dir.rstrip('/')}/{MODEL_DIR}"


def backing_custom_job(pipeline: TrainingPipeline, spec: CustomJobSpec) -> dict[str, Any]:
    """The body of the pipeline's backing CustomJob, as a customJobs create would have recorded it."""
    body: dict[str, Any] = {"displayName": f"{pipeline.display_name}{BACKING_JOB_SUFFIX}",
                            "jobSpec": spec.to_resource()}
    if pipeline.labels:
        body["labels"] = dict(pipeline.labels)
    if pipeline.encryption_spec:
        body["encryptionSpec"] = pipeline.encryption_spec
    return body


def recorded(pipeline: TrainingPipeline, custom_job_name: str) -> dict[str, Any]:
    """The pipeline's record body: the pipeline as given (trainingTaskInputs as sent, keys and
    all: the SDK reads them back by its own names) and the backing CustomJob's name."""
    body = pipeline.model_dump(mode="json", by_alias=True, exclude_none=True)
    body["trainingTaskMetadata"] = {"backingCustomJob": custom_job_name}
    return body


def model_numeric_id(pipeline_id: str) -> str:
    """The ID of the Model a pipeline uploads when the client gave no modelId: a number of 19
    digits like the service's, fixed by the pipeline so that two readers settling the same
    pipeline at once make one Model."""
    digest = int.from_bytes(hashlib.sha256(f"model-of-{pipeline_id}".encode()).digest()[:8], "big")
    return str(10**18 + digest % (9 * 10**18))


def model_id_of(pipeline: Record) -> str:
    return pipeline.body.get("modelId") or model_numeric_id(pipeline.id)


def awaits_upload(pipeline: Record) -> bool:
    """Whether a pipeline has a Model to upload that it neither uploaded nor failed to."""
    model = pipeline.body.get("modelToUpload")
    return model is not None and not model.get("name") and "error" not in pipeline.body


def uploaded_model(pipeline: Record, model_id: str, output_dir: str, at: str) -> dict[str, Any]:
    """The Model resource a succeeded pipeline uploads (model.proto), made at `at` (RFC 3339)."""
    given = {key: value for key, value in (pipeline.body.get("modelToUpload") or {}).items()
             if key not in MODEL_OUTPUT_FIELDS}
    aliases = list(given.pop("versionAliases", None) or [])
    if DEFAULT_ALIAS not in aliases:
        aliases.insert(0, DEFAULT_ALIAS)  # "New model uploads, i.e. version 1, will always be "default" aliased."
    if pipeline.body.get("labels") and "labels" not in given:
        given["labels"] = pipeline.body["labels"]
    return {
        "name": resource_name(pipeline.project, pipeline.location, MODELS, model_id),
        **given,
        "versionId": FIRST_VERSION,
        "versionAliases": aliases,
        "versionCreateTime": at,
        "versionUpdateTime": at,
        "trainingPipeline": pipeline.name,
        "artifactUri": artifact_uri(output_dir),
        "supportedDeploymentResourcesTypes": ["DEDICATED_RESOURCES"],
        "createTime": at,
        "updateTime": at,
        "modelSourceInfo": {"sourceType": "CUSTOM"},
    }


def with_upload(pipeline: Record, model_name: str) -> dict[str, Any]:
    """The pipeline's body once its Model is uploaded: modelToUpload named, version 1."""
    body = copy.deepcopy(pipeline.body)
    body["modelToUpload"].update(name=model_name, versionId=FIRST_VERSION)
    return body


def with_upload_error(pipeline: Record, code: int, message: str) -> dict[str, Any]:
    return {**copy.deepcopy(pipeline.body), "error": {"code": code, "message": message}}


def no_artifacts_message(output_dir: str) -> str:
    """The service's words for a trainer that wrote nothing to AIP_MODEL_DIR."""
    return f'There are no files under "{artifact_uri(output_dir)}" to copy.'


def pipeline_state(pipeline: Record, job: Job | None) -> PipelineState:
    """The ml v1 job's state, except that a pipeline still uploading its Model is running and one
    whose upload failed has failed."""
    if "error" in pipeline.body:
        return PipelineState.PIPELINE_STATE_FAILED
    state = PipelineState[job_state(job).name.replace("JOB_STATE_", "PIPELINE_STATE_")]
    if state is PipelineState.PIPELINE_STATE_SUCCEEDED and awaits_upload(pipeline):
        return PipelineState.PIPELINE_STATE_RUNNING
    return state


def training_pipeline(record: Record, job: Job | None) -> dict[str, Any]:
    """The TrainingPipeline resource, as the service answered it."""
    body = record.body
    resource: dict[str, Any] = {"name": record.name, **{k: v for k, v in body.items() if k != "error"}}
    resource["state"] = pipeline_state(record, job).name
    resource.update(times(record, job))
    error = body.get("error") or error_of(job)
    if error:
        resource["error"] = error
    return resource


def model(record: Record, job: Job | None) -> dict[str, Any]:
    """A Model as uploaded: its record holds it whole."""
    return dict(record.body)

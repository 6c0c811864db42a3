"""trainingPipelines of the custom task and the Models they upload (aiptrain.vertex.pipelines),
and the SDK's script launcher made to install offline (aiptrain.vertex.scripts): pure rules."""

from __future__ import annotations

import pytest

from aiptrain.errors import ValidationError
from aiptrain.model import Job
from aiptrain.states import State
from aiptrain.topology import MASTER, WORKER
from aiptrain.vertex import pipelines
from aiptrain.vertex.pipelines import CUSTOM_TASK, PipelineState, TrainingPipeline
from aiptrain.vertex.records import PIPELINES, Record
from aiptrain.vertex.resources import ContainerSpec
from aiptrain.vertex.scripts import OFFLINE_PIP, launched_package, offline_env
from aiptrain.vertex.translate import translate

SERVING = "us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-0:latest"
# What CustomContainerTrainingJob(...).run(replica_count=2, args=["--x", 1], environment_variables={"A": "b"},
# timeout=100, base_output_dir="gs://b/out") sent (captured from google-cloud-aiplatform 2.7 over REST):
# trainingTaskInputs is a protobuf Value, snake_case keys beside the camelCase of the specs it
# copied in, every number a double, and nulls for the scheduling it left unset.
SDK_POOL = {
    "replica_count": 1.0,
    "machine_spec": {"machine_type": "n1-standard-4"},
    "disk_spec": {"boot_disk_size_gb": 100.0, "boot_disk_type": "pd-ssd"},
    "containerSpec": {"args": ["--x", 1.0], "imageUri": "aiptrain/runtime:2.11",
                      "command": ["python3", "-c", "print(1)"], "env": [{"value": "b", "name": "A"}]},
}
SDK_BODY = {
    "displayName": "ccj",
    "trainingTaskDefinition": CUSTOM_TASK,
    "trainingTaskInputs": {
        "worker_pool_specs": [SDK_POOL, SDK_POOL],
        "base_output_directory": {"output_uri_prefix": "gs://b/out"},
        "scheduling": {"restart_job_on_worker_restart": False, "max_wait_duration": None, "timeout": "100s",
                       "strategy": None, "disable_retries": False},
    },
    "modelToUpload": {"displayName": "ccj-model", "containerSpec": {"imageUri": SERVING},
                      "versionAliases": ["default"]},
}


def pipeline(**changes) -> TrainingPipeline:
    body = {**SDK_BODY, **changes}
    return TrainingPipeline.model_validate({key: value for key, value in body.items() if value is not None})


def test_the_sdks_task_inputs_read_as_a_custom_job_spec():
    spec = pipelines.custom_task(pipeline())
    pools = spec.worker_pool_specs
    assert [pool.replica_count for pool in pools] == [1, 1]
    assert pools[0].container_spec.args == ["--x", "1"]  # the SDK's int, a double in the Value
    assert pools[0].disk_spec.boot_disk_size_gb == 100
    assert spec.scheduling.timeout == "100s" and spec.scheduling.strategy is None
    translation = translate("training_pipeline_1", "2", spec, where="trainingTaskInputs")
    assert translation.job.training_input.worker_count == 1
    assert translation.contract.output_dir == "gs://b/out"
    assert translation.contract.env == {"CLOUD_ML_JOB_ID": "2"}  # the backing CustomJob's ID


@pytest.mark.parametrize(("changes", "message"), [
    ({"trainingTaskDefinition": None}, "trainingTaskDefinition is required"),
    ({"trainingTaskDefinition": pipelines.SCHEMAS + "automl_tabular_1.0.0.yaml"},
     "AutoML training has no equivalent"),
    ({"trainingTaskDefinition": pipelines.TUNING_TASK}, "create a hyperparameterTuningJob"),
    ({"inputDataConfig": {"datasetId": "123"}}, "inputDataConfig (a managed dataset) is not served"),
    ({"parentModel": "projects/p/locations/l/models/1"}, "leave parentModel out"),
    ({"modelId": "9model"}, "modelId [9model] is invalid"),
    ({"modelToUpload": {"containerSpec": {"imageUri": SERVING}}}, "modelToUpload.displayName is required"),
    ({"modelToUpload": {"displayName": "m"}}, "modelToUpload.containerSpec.imageUri is required"),
    ({"trainingTaskInputs": None}, "trainingTaskInputs is required"),
    ({"trainingTaskInputs": {"worker_pool_specs": [SDK_POOL], "workerPools": []}},
     "trainingTaskInputs.workerPools: Extra inputs are not permitted"),
    ({"trainingTaskInputs": {"worker_pool_specs": [SDK_POOL]}},
     "baseOutputDirectory.outputUriPrefix is required with modelToUpload"),
])
def test_what_a_pipeline_cannot_be_is_refused_in_one_line(changes, message):
    with pytest.raises(ValidationError) as refused:
        pipelines.custom_task(pipeline(**changes))
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_pipeline_without_a_model_needs_no_output_directory():
    spec = pipelines.custom_task(pipeline(modelToUpload=None, trainingTaskInputs={"workerPoolSpecs": [SDK_POOL]}))
    assert pipelines.base_output_dir(spec) is None


def test_the_backing_custom_job_is_named_after_the_pipeline():
    given = pipeline(labels={"team": "a"})
    body = pipelines.backing_custom_job(given, pipelines.custom_task(given))
    assert body["displayName"] == "ccj-custom-job"
    assert body["labels"] == {"team": "a"}
    assert body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"] == ["--x", "1"]
    assert body["jobSpec"]["baseOutputDirectory"] == {"outputUriPrefix": "gs://b/out"}


def record(body: dict | None = None, numeric: str = "1234") -> Record:
    given = body if body is not None else pipelines.recorded(pipeline(), "projects/p/locations/l/customJobs/9")
    return Record("p", PIPELINES, numeric, "us-central1", "2026-01-01T00:00:00Z", given, "p--training_pipeline_1234")


def job(state: State | None, error: str | None = None) -> Job:
    return Job(job_id="training_pipeline_1234", state=state, error_message=error)


@pytest.mark.parametrize(("state", "expected"), [
    (None, PipelineState.PIPELINE_STATE_QUEUED),
    (State.QUEUED, PipelineState.PIPELINE_STATE_QUEUED),
    (State.PREPARING, PipelineState.PIPELINE_STATE_PENDING),
    (State.RUNNING, PipelineState.PIPELINE_STATE_RUNNING),
    (State.SUCCEEDED, PipelineState.PIPELINE_STATE_RUNNING),  # its Model is not uploaded yet
    (State.FAILED, PipelineState.PIPELINE_STATE_FAILED),
    (State.CANCELLING, PipelineState.PIPELINE_STATE_CANCELLING),
    (State.CANCELLED, PipelineState.PIPELINE_STATE_CANCELLED),
])
def test_a_pipeline_is_in_its_jobs_state_until_its_model_is_uploaded(state, expected):
    assert pipelines.pipeline_state(record(), job(state)) is expected


def test_a_pipeline_with_its_model_uploaded_has_succeeded():
    uploaded = record(pipelines.with_upload(record(), "projects/p/locations/us-central1/models/7"))
    resource = pipelines.training_pipeline(uploaded, job(State.SUCCEEDED))
    assert resource["state"] == "PIPELINE_STATE_SUCCEEDED"
    assert resource["modelToUpload"]["name"] == "projects/p/locations/us-central1/models/7"
    assert resource["modelToUpload"]["versionId"] == "1"
    assert resource["trainingTaskMetadata"] == {"backingCustomJob": "projects/p/locations/l/customJobs/9"}
    assert resource["trainingTaskInputs"] == SDK_BODY["trainingTaskInputs"]  # as sent, keys and nulls
    assert "error" not in resource


def test_a_pipeline_without_a_model_succeeds_with_its_job():
    plain = record(pipelines.recorded(pipeline(modelToUpload=None), "projects/p/locations/l/customJobs/9"))
    assert pipelines.pipeline_state(plain, job(State.SUCCEEDED)) is PipelineState.PIPELINE_STATE_SUCCEEDED


def test_a_pipeline_whose_model_could_not_be_uploaded_has_failed():
    failed = record(pipelines.with_upload_error(record(), pipelines.FAILED_PRECONDITION,
                                                pipelines.no_artifacts_message("gs://b/out/")))
    resource = pipelines.training_pipeline(failed, job(State.SUCCEEDED))
    assert resource["state"] == "PIPELINE_STATE_FAILED"
    assert resource["error"] == {"code": 9, "message": 'There are no files under "gs://b/out/model" to copy.'}
    assert not pipelines.awaits_upload(failed)


def test_a_cancelled_pipeline_says_so_as_a_cancelled_job_does():
    resource = pipelines.training_pipeline(record(), job(State.CANCELLED))
    assert resource["state"] == "PIPELINE_STATE_CANCELLED"
    assert resource["error"] == {"code": 1, "message": "CANCELED"}


def test_the_uploaded_model_is_version_one_of_the_trainers_model_dir():
    pipe = record(pipelines.recorded(pipeline(labels={"team": "a"}), "projects/p/locations/l/customJobs/9"))
    model = pipelines.uploaded_model(pipe, "42", "gs://b/out/", "2026-01-01T00:01:00Z")
    assert model["name"] == "projects/p/locations/us-central1/models/42"
    assert model["displayName"] == "ccj-model"
    assert model["containerSpec"] == {"imageUri": SERVING}
    assert model["artifactUri"] == "gs://b/out/model"
    assert (model["versionId"], model["versionAliases"]) == ("1", ["default"])
    assert model["trainingPipeline"] == "projects/p/locations/us-central1/trainingPipelines/1234"
    assert model["labels"] == {"team": "a"}
    assert model["createTime"] == model["versionCreateTime"] == "2026-01-01T00:01:00Z"


def test_version_one_is_always_the_default_one():
    given = pipeline(modelToUpload={"displayName": "m", "containerSpec": {"imageUri": SERVING},
                                    "versionAliases": ["first"]})
    model = pipelines.uploaded_model(record(pipelines.recorded(given, "c")), "42", "gs://b/out", "t")
    assert model["versionAliases"] == ["default", "first"]


def test_the_model_id_is_the_clients_or_one_number_per_pipeline():
    assert pipelines.model_id_of(record(pipelines.recorded(pipeline(modelId="my_model"), "c"))) == "my_model"
    number = pipelines.model_id_of(record())
    assert number == pipelines.model_numeric_id("1234") and len(number) == 19 and number.isdigit()
    assert pipelines.model_numeric_id("1235") != number


def test_the_model_dir_is_read_from_the_task_inputs_as_sent():
    assert pipelines.output_dir_of(record()) == "gs://b/out"


# -- the SDK's script launcher -----------------------------------------------------------------

# What CustomJob.from_local_script(..., container_uri=<not a prebuilt image>, args=["--a", "1"]) gives
# each pool (google/cloud/aiplatform/jobs.py).
LAUNCHER = ["sh", "-c", "pip install --upgrade pip && pip3 install -q --user "
            "/gcs/b/staging/aiplatform-2026-01-01-00:00:00.000-aiplatform_custom_trainer_script-0.1.tar.gz && "
            "python3 -m aiplatform_custom_trainer_script.task --a 1"]


def test_the_sdks_launcher_is_given_no_package_index():
    container = ContainerSpec(image_uri="aiptrain/runtime:2.11", command=LAUNCHER)
    assert launched_package(container).startswith("/gcs/b/staging/aiplatform-")
    assert offline_env(container) == OFFLINE_PIP == {
        "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_BUILD_ISOLATION": "0"}


@pytest.mark.parametrize("command", [
    None,
    ["python3", "-m", "trainer.task"],
    ["sh", "-c", "pip install -r requirements.txt && python3 train.py"],
    ["bash", "-c", LAUNCHER[2]],
])
def test_other_containers_keep_their_environment(command):
    assert offline_env(ContainerSpec(image_uri="img", command=command)) == {}


def test_the_pools_own_variables_win_over_the_launchers():
    spec = pipelines.custom_task(pipeline(trainingTaskInputs={
        "workerPoolSpecs": [
            {"containerSpec": {"imageUri": "img", "command": LAUNCHER, "env": [{"name": "PIP_NO_INDEX", "value": "0"}]}},
            {"replicaCount": 1, "containerSpec": {"imageUri": "img", "command": LAUNCHER}},
        ],
        "baseOutputDirectory": {"outputUriPrefix": "gs://b/out"},
    }))
    env = translate("j", "1", spec).contract.task_env
    assert env[MASTER] == {**OFFLINE_PIP, "PIP_NO_INDEX": "0"}
    assert env[WORKER] == OFFLINE_PIP

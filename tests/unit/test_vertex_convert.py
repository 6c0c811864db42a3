"""AI Platform jobs as Vertex AI jobs and back (aiptrain.vertex.convert), and the executor image
of each runtime version (aiptrain.vertex.images.prebuilt_image): pure, no Docker."""

from __future__ import annotations

import pytest

from aiptrain.errors import ValidationError
from aiptrain.model import Job
from aiptrain.runtime_catalog import SERVICE_PINS
from aiptrain.topology import LEGACY_MACHINE_TYPES
from aiptrain.vertex.convert import (
    CUSTOM_JOB,
    ML_JOB,
    TUNING_JOB,
    compute_engine_type,
    job_id_for,
    to_ai_platform,
    to_vertex,
)
from aiptrain.vertex.images import TF_IMAGE_RELEASES, executor, prebuilt_image

IMAGES = "us-docker.pkg.dev/vertex-ai/training"
PACKAGE = {"packageUris": ["gs://b/trainer-0.1.tar.gz"], "pythonModule": "trainer.task", "runtimeVersion": "2.11"}
PACKAGE_SPEC = {"executorImageUri": f"{IMAGES}/tf-cpu.2-11:latest", "packageUris": ["gs://b/trainer-0.1.tar.gz"],
                "pythonModule": "trainer.task"}


def vertex(training_input: dict, job_id: str = "census_1", **fields):
    return to_vertex(Job.model_validate({"jobId": job_id, "trainingInput": training_input, **fields}), "2.11")


def pools(conversion) -> list[dict]:
    resource = conversion.resource
    return (resource.get("jobSpec") or resource["trialJobSpec"])["workerPoolSpecs"]


def shapes(conversion) -> list[tuple]:
    """Each pool as (machineType, replicaCount, acceleratorType, acceleratorCount); {} for a placeholder."""
    found = []
    for pool in pools(conversion):
        machine = pool.get("machineSpec", {})
        found.append((machine.get("machineType"), pool.get("replicaCount"), machine.get("acceleratorType"),
                      machine.get("acceleratorCount")) if pool else {})
    return found


def noted(conversion, *fragments: str) -> bool:
    return all(any(fragment in note for note in conversion.notes) for fragment in fragments)


# -- AI Platform -> Vertex AI ------------------------------------------------------------------------

def test_a_basic_package_job_is_one_pool_on_its_runtimes_image_with_nothing_to_note():
    converted = vertex({**PACKAGE, "args": ["--epochs", "5"], "region": "europe-west4"}, labels={"team": "ml"})
    assert converted.kind == CUSTOM_JOB and converted.region == "europe-west4" and converted.notes == ()
    assert converted.resource == {
        "displayName": "census_1", "labels": {"team": "ml"},
        "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
            "pythonPackageSpec": {**PACKAGE_SPEC, "args": ["--epochs", "5"]}}]},
    }
    assert converted.gcloud_config == converted.resource["jobSpec"]  # what `gcloud ai custom-jobs create --config` takes


@pytest.mark.parametrize("tier, expected, image", [
    ("BASIC", [("n1-standard-4", "1", None, None)], "tf-cpu.2-11"),
    ("STANDARD_1", [("n1-highcpu-8", "1", None, None), ("n1-highcpu-8", "4", None, None),
                    ("n1-standard-4", "3", None, None)], "tf-cpu.2-11"),
    ("PREMIUM_1", [("n1-highcpu-16", "1", None, None), ("n1-highcpu-16", "19", None, None),
                   ("n1-highmem-8", "11", None, None)], "tf-cpu.2-11"),
    ("BASIC_GPU", [("n1-standard-8", "1", "NVIDIA_TESLA_K80", 1)], "tf-gpu.2-11"),
])
def test_scale_tiers_are_written_out_as_worker_pools(tier, expected, image):
    converted = vertex({**PACKAGE, "scaleTier": tier})
    assert shapes(converted) == expected
    assert {pool["pythonPackageSpec"]["executorImageUri"] for pool in pools(converted)} == {f"{IMAGES}/{image}:latest"}
    assert noted(converted, f"scaleTier {tier} has no equivalent")


@pytest.mark.parametrize("legacy, compute_engine", [
    ("standard", "n1-standard-4"), ("large_model", "n1-highmem-8"), ("complex_model_s", "n1-highcpu-8"),
    ("complex_model_m", "n1-highcpu-16"), ("complex_model_l", "n1-highcpu-32"), ("standard_gpu", "n1-standard-8"),
    ("complex_model_m_gpu", "n1-standard-16"), ("complex_model_l_gpu", "n1-standard-32"),
    ("standard_p100", "n1-standard-8"), ("complex_model_m_p100", "n1-standard-16"),
    ("standard_v100", "n1-standard-8"), ("large_model_v100", "n1-highmem-8"),
    ("complex_model_m_v100", "n1-standard-16"), ("complex_model_l_v100", "n1-standard-32"),
])
def test_each_legacy_machine_type_is_the_compute_engine_machine_it_was(legacy, compute_engine):
    assert compute_engine_type(LEGACY_MACHINE_TYPES[legacy]) == compute_engine


def test_legacy_types_carry_their_gpus_and_say_what_they_were():
    converted = vertex({**PACKAGE, "scaleTier": "CUSTOM", "masterType": "complex_model_m_gpu",
                        "workerType": "complex_model_m", "workerCount": 2})
    assert shapes(converted) == [("n1-standard-16", "1", "NVIDIA_TESLA_K80", 4), ("n1-highcpu-16", "2", None, None)]
    assert [pool["pythonPackageSpec"]["executorImageUri"].rsplit("/", 1)[1] for pool in pools(converted)] == [
        "tf-gpu.2-11:latest", "tf-cpu.2-11:latest"]  # an image per pool: GPUs where they are
    assert noted(converted, "masterType complex_model_m_gpu is a legacy machine type: n1-standard-16 with 4 "
                 "NVIDIA_TESLA_K80", "workerType complex_model_m is a legacy machine type: n1-highcpu-16")


def test_compute_engine_machines_keep_their_names_and_gpus():
    converted = vertex({**PACKAGE, "masterType": "n1-standard-8", "masterConfig": {
        "acceleratorConfig": {"type": "NVIDIA_TESLA_T4", "count": 2}, "diskConfig": {"bootDiskSizeGb": 200}},
        "evaluatorType": "a2-highgpu-1g", "evaluatorCount": 1})
    assert shapes(converted) == [("n1-standard-8", "1", "NVIDIA_TESLA_T4", 2), {}, {},
                                 ("a2-highgpu-1g", "1", "NVIDIA_TESLA_A100", 1)]  # placeholders keep pool numbers
    assert pools(converted)[0]["diskSpec"] == {"bootDiskSizeGb": 200}
    assert converted.notes == ()


def test_a_custom_container_runs_as_it_did_and_workers_default_to_the_masters_image():
    converted = vertex({"masterConfig": {"imageUri": "gcr.io/p/trainer:1"}, "scaleTier": "CUSTOM",
                        "masterType": "n1-standard-4", "workerType": "n1-standard-4", "workerCount": 1,
                        "parameterServerType": "n1-standard-4", "parameterServerCount": 1,
                        "parameterServerConfig": {"imageUri": "gcr.io/p/ps:1", "containerCommand": ["python3", "ps.py"]},
                        "args": ["--steps", "10"], "useChiefInTfConfig": True})
    assert [pool["containerSpec"] for pool in pools(converted)] == [
        {"imageUri": "gcr.io/p/trainer:1", "args": ["--steps", "10"]},
        {"imageUri": "gcr.io/p/trainer:1", "args": ["--steps", "10"]},
        {"imageUri": "gcr.io/p/ps:1", "command": ["python3", "ps.py"]},  # containerCommand is the whole line
    ]
    assert noted(converted, "useChiefInTfConfig has no equivalent")
    assert not noted(converted, "TF_CONFIG named")


@pytest.mark.parametrize("training_input, primary_was_master", [
    ({"masterConfig": {"imageUri": "gcr.io/p/t:1"}}, True),  # custom containers said `master` unless asked
    ({**PACKAGE, "runtimeVersion": "1.15"}, True),
    (PACKAGE, False),
])
def test_a_primary_called_master_is_noted(training_input, primary_was_master):
    assert noted(vertex(training_input), "must look for `chief`") is primary_was_master


def test_a_package_on_a_custom_image_keeps_the_image_and_says_vertex_needs_a_prebuilt_one():
    converted = vertex({**PACKAGE, "masterConfig": {"imageUri": "gcr.io/p/torch:1"}})
    assert pools(converted)[0]["pythonPackageSpec"]["executorImageUri"] == "gcr.io/p/torch:1"
    assert noted(converted, "runs Python packages on its prebuilt images only")
    prebuilt = vertex({**PACKAGE, "masterConfig": {"imageUri": "gcr.io/cloud-ml-public/training/pytorch-gpu.1-10"}})
    assert not noted(prebuilt, "prebuilt images only")


@pytest.mark.parametrize("job_dir, output, note", [
    ("gs://b/out", {"outputUriPrefix": "gs://b/out"}, "jobDir -> baseOutputDirectory: `--job-dir DIR` is no longer "
     "passed as an argument; the trainer reads AIP_MODEL_DIR (DIR/model/)"),
    ("/tmp/out", None, "jobDir /tmp/out is not a gs:// URI"),
])
def test_job_dir_becomes_the_base_output_directory_read_from_aip_model_dir(job_dir, output, note):
    converted = vertex({**PACKAGE, "jobDir": job_dir})
    assert converted.resource["jobSpec"].get("baseOutputDirectory") == output
    assert noted(converted, note)


@pytest.mark.parametrize("scheduling, expected, note", [
    ({"maxRunningTime": "7200s"}, {"timeout": "7200s"}, None),
    ({"maxWaitTime": "600s"}, {"strategy": "FLEX_START", "maxWaitDuration": "600s"}, "strategy FLEX_START"),
    ({"maxRunningTime": "60s", "priority": 5}, {"timeout": "60s"}, "scheduling.priority has no equivalent"),
    ({"priority": 5}, None, "scheduling.priority has no equivalent"),
])
def test_scheduling(scheduling, expected, note):
    converted = vertex({**PACKAGE, "scheduling": scheduling})
    assert converted.resource["jobSpec"].get("scheduling") == expected
    assert noted(converted, note) if note else converted.notes == ()


def test_what_lies_beside_the_pools_goes_where_vertex_keeps_it():
    converted = vertex({**PACKAGE, "serviceAccount": "sa@p.iam.gserviceaccount.com", "network": "projects/1/global/"
                        "networks/n", "enableWebAccess": True, "encryptionConfig": {"kmsKeyName": "projects/p/k"}})
    spec = converted.resource["jobSpec"]
    assert (spec["serviceAccount"], spec["network"], spec["enableWebAccess"]) == (
        "sa@p.iam.gserviceaccount.com", "projects/1/global/networks/n", True)
    assert converted.resource["encryptionSpec"] == {"kmsKeyName": "projects/p/k"}


@pytest.mark.parametrize("training_input, expected, note", [
    ({**PACKAGE, "scaleTier": "BASIC_TPU"}, [("n1-standard-4", "1", None, None)], "scaleTier BASIC_TPU: its Cloud TPU"),
    ({**PACKAGE, "scaleTier": "CUSTOM", "masterType": "n1-standard-8", "workerType": "cloud_tpu", "workerCount": 1,
      "workerConfig": {"acceleratorConfig": {"type": "TPU_V2", "count": 8}, "tpuTfVersion": "2.11"}},
     [("n1-standard-8", "1", None, None)], "workerType cloud_tpu: the Cloud TPU workers are left out"),
    ({**PACKAGE, "masterType": "n1-standard-8", "masterConfig": {"acceleratorConfig": {"type": "TPU_V3", "count": 8}}},
     [("n1-standard-8", "1", None, None)], "masterConfig.acceleratorConfig TPU_V3: the TPU is left out"),
])
def test_tpus_are_left_out_with_a_note(training_input, expected, note):
    converted = vertex(training_input)
    assert shapes(converted) == expected and noted(converted, note, "configure-compute")


@pytest.mark.parametrize("training_input, message", [
    ({}, "The job names no program to run"),
    ({"runtimeVersion": "2.11", "packageUris": ["gs://b/t.tar.gz"]}, "The job names no program to run"),
    ({**PACKAGE, "scaleTier": "STANDARD_1", "workerCount": 2}, "--worker-count can only be used when --scale-tier is "
     "CUSTOM"),
    ({**PACKAGE, "masterType": "n1-standard-2"}, "Unknown machine type [n1-standard-2]"),
    ({**PACKAGE, "hyperparameters": {"resumePreviousJobId": "old"}}, "Vertex AI cannot resume an AI Platform study"),
])
def test_refusals_are_one_line(training_input, message):
    with pytest.raises(ValidationError) as refused:
        vertex(training_input)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_package_job_without_gs_packages_says_so():
    assert noted(vertex({**PACKAGE, "packageUris": ["/tmp/t.tar.gz"]}), "packageUris /tmp/t.tar.gz are not gs:// URIs")
    assert noted(vertex({"pythonModule": "trainer.task"}), "packageUris is empty",
                 "runtimeVersion is not given: aiptrain's default, 2.11")


HYPERPARAMETERS = {
    "goal": "MINIMIZE", "hyperparameterMetricTag": "loss", "maxTrials": 6, "maxParallelTrials": 2,
    "maxFailedTrials": 1, "algorithm": "RANDOM_SEARCH", "enableTrialEarlyStopping": True,
    "params": [
        {"parameterName": "lr", "type": "DOUBLE", "minValue": 0.0001, "maxValue": 0.1, "scaleType": "UNIT_LOG_SCALE"},
        {"parameterName": "units", "type": "INTEGER", "minValue": 8, "maxValue": 64, "scaleType": "UNIT_LINEAR_SCALE"},
        {"parameterName": "opt", "type": "CATEGORICAL", "categoricalValues": ["adam", "sgd"]},
        {"parameterName": "batch", "type": "DISCRETE", "discreteValues": [16, 32, 64]},
    ],
}


def test_hyperparameters_make_a_tuning_job_whose_trials_run_the_job_spec():
    converted = vertex({**PACKAGE, "hyperparameters": HYPERPARAMETERS, "jobDir": "gs://b/out"})
    resource = converted.resource
    assert converted.kind == TUNING_JOB and converted.gcloud_config == resource  # hp-tuning-jobs --config: whole
    assert (resource["maxTrialCount"], resource["parallelTrialCount"], resource["maxFailedTrialCount"]) == (6, 2, 1)
    assert resource["studySpec"] == {
        "metrics": [{"metricId": "loss", "goal": "MINIMIZE"}],
        "parameters": [
            {"parameterId": "lr", "doubleValueSpec": {"minValue": 0.0001, "maxValue": 0.1}, "scaleType": "UNIT_LOG_SCALE"},
            {"parameterId": "units", "integerValueSpec": {"minValue": "8", "maxValue": "64"},
             "scaleType": "UNIT_LINEAR_SCALE"},
            {"parameterId": "opt", "categoricalValueSpec": {"values": ["adam", "sgd"]}},
            {"parameterId": "batch", "discreteValueSpec": {"values": [16.0, 32.0, 64.0]}},
        ],
        "algorithm": "RANDOM_SEARCH",
        "decayCurveStoppingSpec": {"useElapsedDuration": False},
    }
    assert resource["trialJobSpec"]["baseOutputDirectory"] == {"outputUriPrefix": "gs://b/out"}
    assert noted(converted, "per trial, DIR/TRIAL_ID/model/")


def test_a_study_with_the_defaults_names_the_default_metric_and_counts():
    converted = vertex({**PACKAGE, "hyperparameters": {"params": [HYPERPARAMETERS["params"][2]]}})
    assert converted.resource["studySpec"]["metrics"] == [{"metricId": "training/hptuning/metric", "goal": "MAXIMIZE"}]
    assert "algorithm" not in converted.resource["studySpec"]  # unspecified: the default search on both
    assert (converted.resource["maxTrialCount"], converted.resource["parallelTrialCount"]) == (1, 1)


# -- the executor images -----------------------------------------------------------------------------

@pytest.mark.parametrize("runtime, gpu, uri, note", [
    ("2.11", False, f"{IMAGES}/tf-cpu.2-11:latest", None),
    ("2.8", True, f"{IMAGES}/tf-gpu.2-8:latest", None),
    ("1.15", False, f"{IMAGES}/tf-cpu.1-15:latest", None),
    ("2.10", False, f"{IMAGES}/tf-cpu.2-11:latest", "runtimeVersion 2.10 has no prebuilt training image"),
    ("1.14", False, f"{IMAGES}/tf-cpu.1-15:latest", "runtimeVersion 1.14 has no prebuilt training image"),
    ("minimal", False, f"{IMAGES}/tf-cpu.2-11:latest", "runtimeVersion minimal is aiptrain's own"),
    (f"{IMAGES}/pytorch-gpu.1-13:latest", True, f"{IMAGES}/pytorch-gpu.1-13:latest", None),  # a mapped executor
    ("pytorch-2.13", False, f"{IMAGES}/pytorch-cpu.2-4.py310:latest", "runtimeVersion pytorch-2.13 (PyTorch 2.13.0)"),
    ("pytorch-2.13", True, f"{IMAGES}/pytorch-gpu.2-4.py310:latest", "is aiptrain's own"),
])
def test_prebuilt_images_of_runtime_versions(runtime, gpu, uri, note):
    image = prebuilt_image(runtime, gpu)
    assert image.uri == uri
    assert (note in image.note) if note else image.note is None


@pytest.mark.parametrize("runtime", [version for version in SERVICE_PINS if version in TF_IMAGE_RELEASES])
@pytest.mark.parametrize("gpu", [False, True])
def test_each_runtimes_image_maps_back_to_that_runtime(runtime, gpu):
    assert executor(prebuilt_image(runtime, gpu).uri).runtime_version == runtime


# -- Vertex AI -> AI Platform ------------------------------------------------------------------------

def test_a_custom_job_of_containers_becomes_a_custom_tier_job():
    body = {"displayName": "census training", "labels": {"team": "ml"}, "jobSpec": {
        "workerPoolSpecs": [
            {"machineSpec": {"machineType": "n1-standard-8", "acceleratorType": 5, "acceleratorCount": 1},
             "replicaCount": "1", "diskSpec": {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 100},
             "containerSpec": {"imageUri": "gcr.io/p/t:1", "command": ["python3", "-m", "t"], "args": ["--a"],
                               "env": [{"name": "MODE", "value": "x"}]}},
            {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": 2,
             "containerSpec": {"imageUri": "gcr.io/p/t:1", "command": ["python3", "-m", "t"], "args": ["--b"]}},
        ],
        "baseOutputDirectory": {"outputUriPrefix": "gs://b/out"}, "serviceAccount": "sa@p.iam.gserviceaccount.com",
        "scheduling": {"timeout": "3600s", "strategy": "SPOT", "restartJobOnWorkerRestart": True},
        "tensorboard": "projects/p/locations/l/tensorboards/1",
    }}
    converted = to_ai_platform(body, "job.yaml", "job", region="us-central1")
    assert converted.kind == ML_JOB and converted.name == "census_training"
    assert converted.resource == {
        "jobId": "census_training", "labels": {"team": "ml"},
        "trainingInput": {
            "scaleTier": "CUSTOM", "masterType": "n1-standard-8", "workerType": "n1-standard-4", "workerCount": "2",
            "masterConfig": {"imageUri": "gcr.io/p/t:1", "containerCommand": ["python3", "-m", "t"],
                             "containerArgs": ["--a"], "acceleratorConfig": {"type": "NVIDIA_TESLA_T4", "count": "1"},
                             "diskConfig": {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 100}},
            "workerConfig": {"imageUri": "gcr.io/p/t:1", "containerCommand": ["python3", "-m", "t"],
                             "containerArgs": ["--b"]},
            "useChiefInTfConfig": True,  # Vertex AI's primary is `chief`; a custom container's was `master`
            "region": "us-central1", "jobDir": "gs://b/out", "serviceAccount": "sa@p.iam.gserviceaccount.com",
            "scheduling": {"maxRunningTime": "3600s"},
        },
    }
    assert noted(converted, "displayName 'census training' -> jobId census_training",
                 "baseOutputDirectory -> jobDir: the trainer gets `--job-dir gs://b/out` instead of AIP_MODEL_DIR "
                 "(gs://b/out/model/)", "workerPoolSpecs[0] env MODE", "scheduling.strategy SPOT has no equivalent",
                 "scheduling.restartJobOnWorkerRestart has no equivalent", "tensorboard has no equivalent")


def test_a_job_spec_as_gcloud_takes_it_runs_its_package_on_the_images_runtime():
    spec = {"workerPoolSpecs": [
        {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": 1,
         "pythonPackageSpec": {**PACKAGE_SPEC, "executorImageUri": f"{IMAGES}/tf-cpu.2-13.py310:latest",
                               "args": ["--epochs", "1"]}},
        {}, {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": 1,
             "pythonPackageSpec": {**PACKAGE_SPEC, "args": ["--ps"]}},
    ]}
    converted = to_ai_platform(spec, "spec.yaml", "spec")
    ti = converted.resource["trainingInput"]
    assert converted.resource["jobId"] == "spec"
    assert (ti["runtimeVersion"], ti["pythonModule"], ti["packageUris"], ti["args"]) == (
        "2.11", "trainer.task", ["gs://b/trainer-0.1.tar.gz"], ["--epochs", "1"])
    assert (ti["parameterServerType"], ti["parameterServerCount"]) == ("n1-standard-4", "1")
    assert "useChiefInTfConfig" not in ti  # runtime 2.11 names the primary `chief` anyway
    assert noted(converted, "runs on runtime 2.11", "workerPoolSpecs[2] args differ")


def test_a_tuning_job_as_the_sdk_sends_it_becomes_hyperparameters():
    body = {"displayName": "study", "maxTrialCount": 4, "parallelTrialCount": 2,
            "studySpec": {
                "metrics": [{"metricId": "accuracy", "goal": 1}, {"metricId": "loss", "goal": 2}],
                "parameters": [
                    {"parameterId": "lr", "doubleValueSpec": {"minValue": 0.001, "maxValue": 0.1}, "scaleType": 2},
                    {"parameterId": "units", "integerValueSpec": {"minValue": "8", "maxValue": "64"}},
                    {"parameterId": "opt", "categoricalValueSpec": {"values": ["adam", "sgd"]},
                     "conditionalParameterSpecs": [{"parameterSpec": {"parameterId": "momentum", "doubleValueSpec": {
                         "minValue": 0.1, "maxValue": 0.9}}, "parentCategoricalValues": {"values": ["sgd"]}}]},
                    {"parameterId": "batch", "discreteValueSpec": {"values": [16, 32]}},
                ],
                "algorithm": 3, "medianAutomatedStoppingSpec": {},
            },
            "trialJobSpec": {"workerPoolSpecs": [{"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": 1,
                                                  "pythonPackageSpec": PACKAGE_SPEC}]}}
    converted = to_ai_platform(body, "hp.json", "hp")
    assert converted.resource["trainingInput"]["hyperparameters"] == {
        "goal": "MAXIMIZE", "hyperparameterMetricTag": "accuracy", "maxTrials": "4", "maxParallelTrials": "2",
        "algorithm": "RANDOM_SEARCH", "enableTrialEarlyStopping": True,
        "params": [
            {"parameterName": "lr", "type": "DOUBLE", "minValue": 0.001, "maxValue": 0.1, "scaleType": "UNIT_LOG_SCALE"},
            {"parameterName": "units", "type": "INTEGER", "minValue": 8.0, "maxValue": 64.0},
            {"parameterName": "opt", "type": "CATEGORICAL", "categoricalValues": ["adam", "sgd"]},
            {"parameterName": "batch", "type": "DISCRETE", "discreteValues": [16.0, 32.0]},
        ],
    }
    assert noted(converted, "studySpec.metrics holds 2 metrics; AI Platform tuned one: accuracy is kept",
                 "studySpec.parameters[2] (opt).conditionalParameterSpecs (momentum)")


@pytest.mark.parametrize("data, message", [
    ([1, 2], "job.yaml must hold a CustomJob, a CustomJobSpec or a HyperparameterTuningJob"),
    ({"displayName": "x"}, "job.yaml holds no jobSpec, workerPoolSpecs or studySpec"),
    ({"trainingTaskInputs": {}}, "holds a TrainingPipeline"),
    ({"displayName": "x", "jobSpec": {"workerPoolSpecs": [{"replicaCount": 1, "containerSpec": {"imageUri": "i"},
                                                           "colour": "red"}]}},
     "Invalid CustomJob in job.yaml: jobSpec.workerPoolSpecs[0].colour: Extra inputs are not permitted."),
    ({"displayName": "x"} | {"jobSpec": None}, "job.yaml: jobSpec is required"),
    ({"workerPoolSpecs": [{"replicaCount": 1, "containerSpec": {"imageUri": "i"}},
                          {"replicaCount": 1, "pythonPackageSpec": PACKAGE_SPEC}]},
     "job.yaml: CustomJobSpec.workerPoolSpecs mix containerSpec and pythonPackageSpec"),
    ({"studySpec": {"metrics": [{"metricId": "m"}], "parameters": [{"parameterId": "p"}]},
      "trialJobSpec": {"workerPoolSpecs": [{"replicaCount": 1, "containerSpec": {"imageUri": "i"}}]}},
     "studySpec.parameters[0] (p) needs exactly one of doubleValueSpec"),
    ({"studySpec": {"parameters": []},
      "trialJobSpec": {"workerPoolSpecs": [{"replicaCount": 1, "containerSpec": {"imageUri": "i"}}]}},
     "studySpec.metrics is required"),
])
def test_vertex_refusals_are_one_line(data, message):
    with pytest.raises(ValidationError) as refused:
        to_ai_platform(data, "job.yaml", "job")
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("name, job_id", [
    ("census_1", "census_1"), ("census training v2", "census_training_v2"), ("2026-01 run", "job_2026_01_run"),
    ("---", "job"), ("é", "job"), ("x" * 200, "x" * 128),
])
def test_display_names_as_job_ids(name, job_id):
    assert job_id_for(name) == job_id


# -- there and back ----------------------------------------------------------------------------------

@pytest.mark.parametrize("training_input", [
    {**PACKAGE, "args": ["--epochs", "5"], "jobDir": "gs://b/out", "scheduling": {"maxRunningTime": "600s"}},
    {**PACKAGE, "scaleTier": "CUSTOM", "masterType": "n1-highcpu-16", "workerType": "n1-highcpu-16", "workerCount": 3,
     "parameterServerType": "n1-highmem-8", "parameterServerCount": 2, "evaluatorType": "n1-standard-4",
     "evaluatorCount": 1},
    {"scaleTier": "CUSTOM", "masterType": "n1-standard-8", "masterConfig": {"imageUri": "gcr.io/p/t:1",
     "acceleratorConfig": {"type": "NVIDIA_TESLA_V100", "count": 2}, "containerArgs": ["--x"]}, "useChiefInTfConfig": True},
    {**PACKAGE, "hyperparameters": HYPERPARAMETERS},
])
def test_a_job_converted_there_and_back_is_the_same_job(training_input):
    original = Job.model_validate({"jobId": "j", "labels": {"a": "b"}, "trainingInput": training_input})
    there = to_vertex(original, "2.11")
    back = to_ai_platform(there.resource, "there.yaml", "x")
    expected = original.training_input.to_resource()
    got = back.resource["trainingInput"]
    expected.setdefault("scaleTier", "CUSTOM")  # written out as pools, which ml v1 calls CUSTOM
    expected.setdefault("masterType", "n1-standard-4")
    if "hyperparameters" in expected:  # ml v1 keeps numbers as sent, Vertex AI types them
        got["hyperparameters"]["params"] = expected["hyperparameters"]["params"]
    assert got == expected and back.resource["labels"] == {"a": "b"} and back.name == "j"


def test_a_study_parameter_maps_as_the_tuning_job_runs_it_and_says_what_ml_v1_cannot_hold():
    spec = {"displayName": "x", "maxTrialCount": 2,
            "studySpec": {"metrics": [{"metricId": "a", "goal": "MAXIMIZE"}], "parameters": [
                {"parameterId": "lr", "scaleType": "UNIT_LOG_SCALE",
                 "doubleValueSpec": {"minValue": 0.1, "maxValue": 1, "defaultValue": 0.5}}]},
            "trialJobSpec": {"workerPoolSpecs": [{"containerSpec": {"imageUri": "i"}, "replicaCount": 1}]}}
    converted = to_ai_platform(spec, "x.yaml", "job")
    assert converted.resource["trainingInput"]["hyperparameters"]["params"] == [
        {"parameterName": "lr", "type": "DOUBLE", "minValue": 0.1, "maxValue": 1.0, "scaleType": "UNIT_LOG_SCALE"}]
    assert converted.notes == ("studySpec.parameters[0] (lr).doubleValueSpec.defaultValue has no equivalent in "
                               "ml v1: left out.",)

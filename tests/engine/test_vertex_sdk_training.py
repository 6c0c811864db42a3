"""The real google-cloud-aiplatform SDK's training-job classes against `aiptrain serve` (a server
on a free loopback port, gs:// kept on this machine), unchanged: CustomTrainingJob (a script the
SDK packages and uploads with google-cloud-storage), CustomContainerTrainingJob,
CustomPythonPackageTrainingJob and CustomJob.from_local_script, each running real containers;
the pipelines' backing CustomJobs, the Models they upload, cancel and delete, as the SDK calls them."""

from __future__ import annotations

import json
import textwrap
import time
import urllib.error
import urllib.request

import pytest
from google.auth.credentials import AnonymousCredentials

from aiptrain.client import Client
from aiptrain.settings import Settings

from conftest import SAMPLE_TRAINER, require_image, runtime_image
from test_real_gcloud import serving

PROJECT, LOCATION, BUCKET = "sdk-training", "us-central1", "aiptrain-sdk-training"
PREBUILT = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-11.py310:latest"  # runtime 2.11 here
SERVING = "us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-0:latest"
SUCCEEDED, CANCELLED = "PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_CANCELLED"
# A trainer as Google's samples write one: the model into AIP_MODEL_DIR through the bucket's
# /gcs mount, with what it was told (its arguments, the backing job's ID, numpy from the image).
SAVE_MODEL = textwrap.dedent("""\
    import json, os, sys
    import numpy
    model_dir = os.environ["AIP_MODEL_DIR"].replace("gs://", "/gcs/")
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "model.json"), "w") as handle:
        json.dump({"args": sys.argv[1:], "job": os.environ["CLOUD_ML_JOB_ID"], "numpy": numpy.__version__}, handle)
    print("saved the model to", model_dir)
""")


@pytest.fixture
def server_url(gcs_home, docker_api, monkeypatch):
    """A server of this test's home; Cloud Storage clients of this process pointed at it."""
    require_image(docker_api, runtime_image("2.11"))
    with serving() as url:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)  # the SDK's uploads, with google-cloud-storage
        yield url


@pytest.fixture
def aiplatform(server_url, monkeypatch):
    """The SDK (imported here: it takes seconds) pointed at the server."""
    from google.cloud import aiplatform
    from google.cloud.aiplatform import jobs, training_jobs

    for module in (jobs, training_jobs):
        monkeypatch.setattr(module, "_JOB_WAIT_TIME", 1)  # the SDK polls every 5 s otherwise
    aiplatform.init(project=PROJECT, location=LOCATION, api_endpoint=server_url, api_transport="rest",
                    credentials=AnonymousCredentials(), staging_bucket=f"gs://{BUCKET}/staging")
    return aiplatform


def kept(uri: str):
    """The local file of a gs:// object of the test's home."""
    return Settings().gcs_root / uri.removeprefix("gs://")


def backing_job(training_job):
    from google.cloud import aiplatform

    return aiplatform.CustomJob.get(training_job.gca_resource.training_task_metadata["backingCustomJob"])


def test_a_custom_training_job_runs_its_script_and_returns_its_model(aiplatform, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SAVE_MODEL)
    job = aiplatform.CustomTrainingJob(display_name="script-job", script_path=str(script), container_uri=PREBUILT,
                                       requirements=["numpy"], model_serving_container_image_uri=SERVING,
                                       labels={"team": "a"})
    model = job.run(base_output_dir=f"gs://{BUCKET}/script", args=["--epochs", 2])

    assert job.state.name == SUCCEEDED
    custom_job = backing_job(job)
    assert custom_job.display_name == "script-job-custom-job"
    assert custom_job.state.name == "JOB_STATE_SUCCEEDED"
    package = custom_job.job_spec.worker_pool_specs[0].python_package_spec
    assert package.python_module == "aiplatform_custom_trainer_script.task"
    assert package.package_uris[0].startswith(f"gs://{BUCKET}/staging/aiplatform-")
    assert model.uri == f"gs://{BUCKET}/script/model"
    saved = json.loads(kept(f"{model.uri}/model.json").read_text())
    assert saved["args"] == ["--epochs", "2"]
    assert saved["job"] == custom_job.name  # CLOUD_ML_JOB_ID: the backing CustomJob's number
    assert (model.version_id, model.display_name) == ("1", "script-job-model")
    assert model.container_spec.image_uri == SERVING
    assert model.labels == {"team": "a"}
    assert model.gca_resource.training_pipeline == job.resource_name
    assert [found.resource_name for found in aiplatform.Model.list(filter='display_name="script-job-model"')] \
        == [model.resource_name]
    assert [found.resource_name for found in aiplatform.CustomTrainingJob.list()] == [job.resource_name]


def test_a_custom_container_training_job_and_its_deletes(aiplatform):
    save = ["python3", "-c", SAVE_MODEL]
    job = aiplatform.CustomContainerTrainingJob(display_name="container-job", container_uri=runtime_image("2.11"),
                                                command=save, model_serving_container_image_uri=SERVING)
    model = job.run(base_output_dir=f"gs://{BUCKET}/container", model_display_name="served", args=["--x", "1"])
    assert job.state.name == SUCCEEDED
    assert json.loads(kept(f"{model.uri}/model.json").read_text())["args"] == ["--x", "1"]
    assert model.display_name == "served"
    custom_job = backing_job(job)

    job.delete()  # the pipeline goes; its backing CustomJob and its Model stay, as on the service
    assert aiplatform.CustomContainerTrainingJob.list() == []
    assert aiplatform.CustomJob.get(custom_job.resource_name).state.name == "JOB_STATE_SUCCEEDED"
    assert aiplatform.Model(model.resource_name).uri == model.uri
    custom_job.delete()
    model.delete()
    assert aiplatform.CustomJob.list() == [] and aiplatform.Model.list() == []


def test_a_trainer_that_saved_no_model_fails_its_pipeline(aiplatform):
    job = aiplatform.CustomContainerTrainingJob(display_name="no-model", container_uri=runtime_image("2.11"),
                                                command=["true"], model_serving_container_image_uri=SERVING)
    with pytest.raises(RuntimeError, match=f'There are no files under \\\\"gs://{BUCKET}/nothing/model\\\\" to copy'):
        job.run(base_output_dir=f"gs://{BUCKET}/nothing")
    assert job.state.name == "PIPELINE_STATE_FAILED"
    assert backing_job(job).state.name == "JOB_STATE_SUCCEEDED"  # the training itself succeeded
    assert aiplatform.Model.list() == []


def test_a_python_package_training_job_runs_the_package_it_was_given(aiplatform):
    from google.cloud import storage

    from aiptrain.packaging import cached_sdist

    sdist = cached_sdist(SAMPLE_TRAINER, Settings().cache_dir).path
    blob = storage.Client(project=PROJECT).bucket(BUCKET).blob(f"packages/{sdist.name}")
    blob.upload_from_filename(str(sdist))
    job = aiplatform.CustomPythonPackageTrainingJob(
        display_name="package-job", python_package_gcs_uri=f"gs://{BUCKET}/packages/{sdist.name}",
        python_module_name="trainer.task", container_uri=PREBUILT, model_serving_container_image_uri=SERVING)
    model = job.run(base_output_dir=f"gs://{BUCKET}/package",
                    args=["--steps", "2", "--job-dir", f"/gcs/{BUCKET}/package/model"])
    assert job.state.name == SUCCEEDED
    assert json.loads(kept(f"{model.uri}/model.json").read_text())["steps"] == 2


@pytest.mark.parametrize("image", [PREBUILT, runtime_image("2.11")], ids=["prebuilt", "own-image"])
def test_custom_job_from_a_local_script(aiplatform, tmp_path, image):
    """A prebuilt image runs the SDK's package as a pythonPackageSpec; another image runs the
    SDK's own `pip install /gcs/...` command, which installs offline here (numpy is the image's)."""
    script = tmp_path / "train.py"
    script.write_text(SAVE_MODEL)
    job = aiplatform.CustomJob.from_local_script(display_name="local-script", script_path=str(script),
                                                 container_uri=image, requirements=["numpy"], args=["--a", "1"],
                                                 base_output_dir=f"gs://{BUCKET}/local")
    job.run()
    assert job.state.name == "JOB_STATE_SUCCEEDED"
    pool = job.job_spec.worker_pool_specs[0]
    assert bool(pool.python_package_spec.executor_image_uri) == (image == PREBUILT)
    assert json.loads(kept(f"gs://{BUCKET}/local/model/model.json").read_text())["args"] == ["--a", "1"]
    # Exported to Kubernetes, its pod sees what its replica saw (tests/unit/test_vertex_export.py has the rest).
    with Client(settings=Settings(), project=PROJECT) as client:
        export = client.export_trainjob(f"custom_job_{job.name}")
    assert export.runtime is not None
    pod = export.runtime.spec["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    env = {variable["name"]: variable.get("value") for variable in pod["containers"][0]["env"]}
    assert (env["CLOUD_ML_JOB_ID"], env["AIP_MODEL_DIR"]) == (job.name, f"gs://{BUCKET}/local/model/")
    assert json.loads(env["AIPTRAIN_CLUSTER"])["names"]["master"] == "workerpool0"
    assert f"/gcs/{BUCKET}" in {mount["mountPath"] for mount in pod["containers"][0]["volumeMounts"]}


def test_cancelling_a_pipeline_cancels_its_backing_job(aiplatform):
    job = aiplatform.CustomContainerTrainingJob(display_name="long-job", container_uri=runtime_image("2.11"),
                                                command=["sleep", "600"])
    job.submit(base_output_dir=f"gs://{BUCKET}/long")
    custom_job = backing_job(job)
    job.cancel()
    deadline = time.monotonic() + 120
    while job.state.name != CANCELLED and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job.state.name == CANCELLED
    assert job.error.code == 1
    assert aiplatform.CustomJob.get(custom_job.resource_name).state.name == "JOB_STATE_CANCELLED"
    job.delete()


@pytest.mark.parametrize(("change", "message"), [
    ({"trainingTaskDefinition": "gs://google-cloud-aiplatform/schema/trainingjob/definition/"
                                "automl_tabular_1.0.0.yaml"}, "AutoML training has no equivalent"),
    ({"inputDataConfig": {"datasetId": "1"}}, "inputDataConfig (a managed dataset) is not served here"),
])
def test_what_the_custom_task_cannot_run_is_refused_over_rest(server_url, aiplatform, change, message):
    body = {"displayName": "refused", "trainingTaskDefinition": "gs://google-cloud-aiplatform/schema/trainingjob/"
            "definition/custom_task_1.0.0.yaml", "trainingTaskInputs": {"workerPoolSpecs": [
                {"replicaCount": 1, "containerSpec": {"imageUri": runtime_image("2.11")}}]}, **change}
    request = urllib.request.Request(f"{server_url}/v1/projects/{PROJECT}/locations/{LOCATION}/trainingPipelines",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    error = json.loads(refused.value.read())["error"]
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
    assert message in error["message"]
    assert aiplatform.CustomJob.list() == []  # nothing half-created

"""Vertex AI hyperparameterTuningJobs on `aiptrain serve`, driven by Google's own clients: the
google-cloud-aiplatform SDK's HyperparameterTuningJob.run() over REST, and the real gcloud's
`ai hp-tuning-jobs create/describe/list/cancel`. Trials are containers of the 2.11 runtime
(which holds cloudml-hypertune) running a trainer given with `python3 -c`: a few seconds each."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from conftest import require_image, runtime_image, wait_for
from test_real_gcloud import configured_gcloud, serving

PROJECT = "hp-tests"
REGION = "us-central1"
BUCKET = "hp-tuning-bucket"
# A trial: its values arrive as --name=value flags; it reports `accuracy` twice through
# cloudml-hypertune (units/10 at step 1, units/20 at step 2, so the best and the last differ)
# and leaves what it saw in its AIP_MODEL_DIR, read through the bucket at /gcs.
TRAINER = r"""
import json, os, sys, time, hypertune
values = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--"))
model_dir = os.environ["AIP_MODEL_DIR"]
local = "/gcs/" + model_dir[len("gs://"):]
os.makedirs(local, exist_ok=True)
seen = {name: os.environ.get(name) for name in ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "CLOUD_ML_TRIAL_ID")}
seen["trial_in_cluster_spec"] = json.loads(os.environ["CLUSTER_SPEC"])["task"].get("trial")
with open(local + "seen.json", "w") as out:
    json.dump({"values": values, **seen}, out)
time.sleep(float(values.get("sleep", 0)))
tuner = hypertune.HyperTune()
units = float(values.get("units", 0))
for step in (1, 2):
    tuner.report_hyperparameter_tuning_metric(hyperparameter_metric_tag="accuracy", metric_value=units / (10 * step),
                                              global_step=step)
"""


@pytest.fixture
def vertex_server(home, docker_api, monkeypatch):
    """`aiptrain serve` of a fresh home (gs:// kept on this machine, with the bucket the trials
    write to): its URL."""
    require_image(docker_api, runtime_image("2.11"))
    monkeypatch.setenv("AIPTRAIN_GCS", "local")
    monkeypatch.setenv("AIPTRAIN_POLL_SECONDS", "0.2")
    with serving() as url:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)  # google-cloud-storage in this process
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        storage.Client(project=PROJECT, credentials=AnonymousCredentials()).create_bucket(BUCKET)
        yield url


def seen_by(home, trial_id: str, prefix: str = "out") -> dict:
    """What a trial's replica saw, from the file it wrote in its AIP_MODEL_DIR."""
    from aiptrain.settings import Settings

    return json.loads((Settings(home=home).gcs_root / BUCKET / prefix / trial_id / "model" / "seen.json").read_text())


def trial_job_spec(prefix: str) -> dict:
    return {"workerPoolSpecs": [{"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": 1,
                                 "containerSpec": {"imageUri": runtime_image("2.11"),
                                                   "command": ["python3", "-c", TRAINER]}}],
            "baseOutputDirectory": {"outputUriPrefix": f"gs://{BUCKET}/{prefix}"}}


def test_the_sdk_runs_a_study_and_reads_its_trials(vertex_server, home, monkeypatch):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform
    from google.cloud.aiplatform import hyperparameter_tuning as hpt
    from google.cloud.aiplatform import jobs as sdk_jobs

    monkeypatch.setattr(sdk_jobs, "_JOB_WAIT_TIME", 0.5)  # the SDK looks every 5 s: the test need not wait so
    aiplatform.init(project=PROJECT, location=REGION, api_endpoint=vertex_server, api_transport="rest",
                    credentials=AnonymousCredentials(), staging_bucket=f"gs://{BUCKET}/staging")
    spec = trial_job_spec("out")
    pool = spec["workerPoolSpecs"][0]
    custom_job = aiplatform.CustomJob(
        display_name="trial", base_output_dir=f"gs://{BUCKET}/out",
        worker_pool_specs=[{"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
                            "container_spec": {"image_uri": pool["containerSpec"]["imageUri"],
                                               "command": pool["containerSpec"]["command"]}}])
    job = aiplatform.HyperparameterTuningJob(
        display_name="sdk-study", custom_job=custom_job, metric_spec={"accuracy": "maximize"},
        parameter_spec={
            "lr": hpt.DoubleParameterSpec(min=1e-4, max=1e-1, scale="log"),
            "units": hpt.IntegerParameterSpec(min=4, max=64, scale="linear"),
            "opt": hpt.CategoricalParameterSpec(values=["adam", "sgd"], conditional_parameter_spec={
                "momentum": hpt.DoubleParameterSpec(min=0.1, max=0.9, scale="linear", parent_values=["sgd"])}),
            "batch": hpt.DiscreteParameterSpec(values=[16, 32], scale="linear"),
        },
        max_trial_count=3, parallel_trial_count=2)  # measurement_selection: the SDK's default, "best"
    job.run()

    assert job.state.name == "JOB_STATE_SUCCEEDED"
    trials = sorted(job.trials, key=lambda trial: int(trial.id))
    assert [trial.id for trial in trials] == ["1", "2", "3"]
    for trial in trials:
        values = {parameter.parameter_id: parameter.value for parameter in trial.parameters}
        assert trial.state.name == "SUCCEEDED"
        assert 1e-4 <= values["lr"] <= 1e-1 and values["units"] == int(values["units"]) and 4 <= values["units"] <= 64
        assert values["opt"] in ("adam", "sgd") and values["batch"] in (16, 32)
        assert ("momentum" in values) == (values["opt"] == "sgd")  # the conditional parameter, only under sgd
        # BEST_MEASUREMENT: the report of step 1 (units/10), not the last one (units/20)
        measurement = trial.final_measurement
        assert measurement.step_count == 1
        assert [(m.metric_id, m.value) for m in measurement.metrics] == [("accuracy", pytest.approx(values["units"] / 10))]
        assert trial.start_time and trial.end_time
        seen = seen_by(home, trial.id)
        assert seen["AIP_MODEL_DIR"] == f"gs://{BUCKET}/out/{trial.id}/model/"
        assert seen["AIP_CHECKPOINT_DIR"] == f"gs://{BUCKET}/out/{trial.id}/checkpoints/"
        assert seen["CLOUD_ML_TRIAL_ID"] == seen["trial_in_cluster_spec"] == trial.id
        assert float(seen["values"]["lr"]) == pytest.approx(values["lr"])
    again = aiplatform.HyperparameterTuningJob.get(job.resource_name)
    assert again.display_name == "sdk-study" and len(again.trials) == 3


def config_file(tmp_path, name: str, trials: int, prefix: str, parameters: list[dict]) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "studySpec": {"metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}], "parameters": parameters,
                      "algorithm": "GRID_SEARCH"},
        "maxTrialCount": trials, "parallelTrialCount": 2, "trialJobSpec": trial_job_spec(prefix)}))
    return str(path)


def created_id(result) -> str:
    found = re.search(r"Hyperparameter tuning job \[(\d+)\] submitted successfully", result.stderr)
    assert found, result.stderr
    return found[1]


def test_gcloud_creates_describes_lists_and_cancels(vertex_server, home, tmp_path):
    gcloud = configured_gcloud(vertex_server, tmp_path, project=PROJECT)
    # GRID_SEARCH over a conditional tree: adam alone, or sgd with units 1 or 2: three points.
    grid = [{"parameterId": "opt", "categoricalValueSpec": {"values": ["adam", "sgd"]},
             "conditionalParameterSpecs": [{"parentCategoricalValues": {"values": ["sgd"]},
                                            "parameterSpec": {"parameterId": "units",
                                                              "integerValueSpec": {"minValue": 1, "maxValue": 2}}}]}]
    study = created_id(gcloud("ai", "hp-tuning-jobs", "create", "--region", REGION, "--display-name", "grid-study",
                              "--config", config_file(tmp_path, "grid", 5, "grid", grid)))
    slow = [{"parameterId": "sleep", "discreteValueSpec": {"values": [300]}}]
    cancelled = created_id(gcloud("ai", "hp-tuning-jobs", "create", "--region", REGION, "--display-name", "slow",
                                  "--config", config_file(tmp_path, "slow", 1, "slow", slow)))

    def describe(job_id: str) -> dict:
        return json.loads(gcloud("ai", "hp-tuning-jobs", "describe", job_id, "--region", REGION,
                                 "--format=json").stdout)

    done = wait_for(lambda: (job := describe(study))["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED") and job,
                    timeout=240, interval=1, what="the grid study to end")
    assert done["state"] == "JOB_STATE_SUCCEEDED", done
    assert done["name"] == f"projects/{PROJECT}/locations/{REGION}/hyperparameterTuningJobs/{study}"
    assert done["maxTrialCount"] == 5 and done["studySpec"]["algorithm"] == "GRID_SEARCH"
    assert done["trialJobSpec"]["workerPoolSpecs"][0]["diskSpec"] == {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 100}
    points = sorted(tuple(sorted((p["parameterId"], p["value"]) for p in trial["parameters"]))
                    for trial in done["trials"])
    assert points == [(("opt", "adam"),), (("opt", "sgd"), ("units", 1)), (("opt", "sgd"), ("units", 2))]
    for trial in done["trials"]:  # the grid's 3 points, not maxTrialCount's 5
        units = {p["parameterId"]: p["value"] for p in trial["parameters"]}.get("units", 0)
        assert trial["state"] == "SUCCEEDED"
        assert trial["finalMeasurement"]["metrics"] == [{"metricId": "accuracy", "value": units / 20}]  # the last
        assert seen_by(home, trial["id"], "grid")["values"] == ({"opt": "sgd", "units": str(units)} if units
                                                                  else {"opt": "adam"})

    listed = json.loads(gcloud("ai", "hp-tuning-jobs", "list", "--region", REGION, "--format=json").stdout)
    assert {job["displayName"] for job in listed} == {"grid-study", "slow"}

    result = gcloud("ai", "hp-tuning-jobs", "cancel", cancelled, "--region", REGION)
    assert f"Request to cancel hyperparameter tuning job [{cancelled}] has been sent" in result.stderr
    ended = wait_for(lambda: (job := describe(cancelled))["state"] == "JOB_STATE_CANCELLED" and job,
                     timeout=120, interval=1, what="the cancelled study to end")
    assert ended["error"]["code"] == 1
    assert all(trial["state"] != "ACTIVE" for trial in ended.get("trials", []))
    again = gcloud("ai", "hp-tuning-jobs", "cancel", cancelled, "--region", REGION, check=False)
    assert again.returncode != 0 and "only a job that has not ended can be cancelled" in again.stderr

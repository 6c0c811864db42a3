"""`aiptrain jobs convert` and `jobs export --format vertex`: the job on stdout, the notes on
stderr, one line and exit 2 for bad input (jobs put straight into an isolated store: no Docker)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from aiptrain.client import Client
from aiptrain.model import Job
from aiptrain.states import State

from conftest import IN_CI

STORED = {"jobId": "census_1", "labels": {"team": "ml"}, "trainingInput": {
    "scaleTier": "STANDARD_1", "packageUris": ["gs://b/trainer-0.1.tar.gz"], "pythonModule": "trainer.task",
    "args": ["--epochs", "5"], "region": "europe-west4", "jobDir": "gs://b/census_1", "runtimeVersion": "2.11"}}
CONFIG = """\
trainingInput:
  scaleTier: CUSTOM
  masterType: complex_model_m
  workerType: complex_model_m
  workerCount: 2
  runtimeVersion: '2.8'
  args: [--from-config]
"""
TUNING = """\
trainingInput:
  packageUris: [gs://b/trainer-0.1.tar.gz]
  pythonModule: trainer.task
  hyperparameters:
    goal: MAXIMIZE
    hyperparameterMetricTag: accuracy
    maxTrials: 4
    params:
    - {parameterName: lr, type: DOUBLE, minValue: 0.001, maxValue: 0.1, scaleType: UNIT_LOG_SCALE}
"""


@pytest.fixture
def stored(home):
    """The job, ended: a queued one would have a controller drive it, and fail it with no engine here."""
    with Client() as client:
        client.store.create(Job.model_validate(STORED))
        client.store.transition(client.key("census_1"), State.SUCCEEDED, [State.QUEUED])
    return "census_1"


def notes(err: str) -> list[str]:
    return [line.removeprefix("NOTE: ") for line in err.splitlines() if line.startswith("NOTE: ")]


def test_a_stored_job_converts_to_a_custom_job_and_export_format_vertex_prints_the_same(run, stored):
    code, out, err = run("jobs", "convert", stored)
    assert code == 0
    custom_job = yaml.safe_load(out)
    assert custom_job["displayName"] == "census_1" and custom_job["labels"] == {"team": "ml"}
    pools = custom_job["jobSpec"]["workerPoolSpecs"]
    assert [(p["machineSpec"]["machineType"], p["replicaCount"]) for p in pools] == [
        ("n1-highcpu-8", "1"), ("n1-highcpu-8", "4"), ("n1-standard-4", "3")]
    assert pools[0]["pythonPackageSpec"] == {
        "executorImageUri": "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-11:latest",
        "packageUris": ["gs://b/trainer-0.1.tar.gz"], "pythonModule": "trainer.task", "args": ["--epochs", "5"]}
    assert custom_job["jobSpec"]["baseOutputDirectory"] == {"outputUriPrefix": "gs://b/census_1"}
    assert any(note.startswith("scaleTier STANDARD_1 has no equivalent") for note in notes(err))
    assert any("`--job-dir DIR` is no longer passed as an argument" in note for note in notes(err))
    assert err.splitlines()[-1].startswith("Create it with `gcloud ai custom-jobs create --region=europe-west4 "
                                           "--display-name=census_1 --config=FILE`")
    assert run("jobs", "export", stored, "--format", "vertex") == (0, out, err)
    code, as_json, _ = run("jobs", "convert", stored, "--format", "json")
    assert code == 0 and json.loads(as_json) == custom_job


def test_export_format_vertex_refuses_fields_and_other_commands_refuse_it(run, stored):
    code, out, err = run("jobs", "export", stored, "--format", "vertex(jobSpec)")
    assert (code, out) == (2, "") and "vertex takes no fields" in err
    code, _, err = run("jobs", "describe", stored, "--format", "vertex")
    assert code == 2 and "use it with `aiptrain jobs export JOB`" in err
    code, _, err = run("jobs", "submit", "training", "new_job", "--module-name", "t.task", "--format", "vertex")
    assert code == 2 and "aiptrain jobs convert --config FILE" in err
    with Client() as client:
        assert client.job_ids() == [stored]  # refused before anything was submitted


def test_a_config_with_the_submit_flags_converts_as_submit_would_merge_them(run, tmp_path):
    config = tmp_path / "census.yaml"
    config.write_text(CONFIG)
    code, out, err = run("jobs", "convert", "--config", str(config), "--module-name", "trainer.task",
                         "--packages", "gs://b/t-0.1.tar.gz,gs://b/dep.whl", "--job-dir", "gs://b/out",
                         "--region", "us-east1", "--labels", "team=ml", "--", "--epochs", "3")
    assert code == 0
    custom_job = yaml.safe_load(out)
    assert custom_job["displayName"] == "census" and custom_job["labels"] == {"team": "ml"}  # the file's name
    package = custom_job["jobSpec"]["workerPoolSpecs"][1]["pythonPackageSpec"]
    assert package == {"executorImageUri": "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-8:latest",
                       "packageUris": ["gs://b/t-0.1.tar.gz", "gs://b/dep.whl"], "pythonModule": "trainer.task",
                       "args": ["--epochs", "3"]}  # args after `--` replace the config's, as on submit
    assert "masterType complex_model_m is a legacy machine type: n1-highcpu-16, the Compute Engine machine it was." \
        in notes(err)
    assert "--region=us-east1" in err.splitlines()[-1]

    code, out, _ = run("jobs", "convert", "--config", str(config), "--module-name", "trainer.task",
                       "--display-name", "census run", "--gcloud-config")
    spec = yaml.safe_load(out)
    assert code == 0 and list(spec) == ["workerPoolSpecs"]  # what `gcloud ai custom-jobs create --config` takes


def test_a_tuning_config_becomes_a_hyperparameter_tuning_job(run, tmp_path):
    config = tmp_path / "study.yaml"
    config.write_text(TUNING)
    code, out, err = run("jobs", "convert", "--config", str(config), "--runtime-version", "2.11")
    tuning_job = yaml.safe_load(out)
    assert code == 0 and tuning_job["maxTrialCount"] == 4
    assert tuning_job["studySpec"]["metrics"] == [{"metricId": "accuracy", "goal": "MAXIMIZE"}]
    assert "trialJobSpec" in tuning_job and "Create it with `gcloud ai hp-tuning-jobs create" in err


def test_a_vertex_file_converts_back_to_the_job_submit_takes(run, tmp_path):
    config = tmp_path / "census.yaml"
    config.write_text(CONFIG)
    _, spec, _ = run("jobs", "convert", "--config", str(config), "--module-name", "trainer.task", "--packages",
                     "gs://b/t-0.1.tar.gz", "--gcloud-config", "--format", "json")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec)
    code, out, err = run("jobs", "convert", "--from-file", str(spec_file), "--to", "ai-platform", "--region",
                         "us-east1", "--display-name", "census_back")
    assert code == 0
    job = yaml.safe_load(out)
    assert job["jobId"] == "census_back"
    assert job["trainingInput"] == {
        "scaleTier": "CUSTOM", "masterType": "n1-highcpu-16", "workerType": "n1-highcpu-16", "workerCount": "2",
        "runtimeVersion": "2.8", "pythonModule": "trainer.task", "packageUris": ["gs://b/t-0.1.tar.gz"],
        "args": ["--from-config"], "region": "us-east1"}
    assert "Submit it with `aiptrain jobs submit training census_back --config=FILE --region=us-east1`" in err

    custom_job = tmp_path / "custom_job.yaml"
    custom_job.write_text(yaml.safe_dump({"displayName": "from sdk", "jobSpec": json.loads(spec)}))
    code, out, err = run("jobs", "convert", "--from-file", str(custom_job))
    assert code == 0 and yaml.safe_load(out)["jobId"] == "from_sdk"
    assert "displayName 'from sdk' -> jobId from_sdk: a job ID takes letters, digits and underscores only." in notes(err)


def test_a_job_that_runs_a_vertex_job_converts_to_that_job_as_created(run, home):
    from aiptrain.vertex.records import CUSTOM_JOBS, VertexRecords

    body = {"displayName": "census training", "labels": {"team": "ml"}, "jobSpec": {"workerPoolSpecs": [
        {"replicaCount": "1", "containerSpec": {"imageUri": "aiptrain/runtime:minimal", "args": ["--x"]}}]}}
    job_id = "custom_job_1234567890123456789"
    with Client() as client:
        client.store.create(Job(job_id=job_id))
        VertexRecords(client.store).add(client.project, CUSTOM_JOBS, "europe-west4", body, job_key=client.key(job_id),
                                        numeric_id="1234567890123456789")
    code, out, err = run("jobs", "convert", job_id)
    assert code == 0 and yaml.safe_load(out) == body
    assert notes(err) == [f"Job {job_id} runs the Vertex AI job projects/{client.project}/locations/europe-west4/"
                          "customJobs/1234567890123456789: this is that job as it was created."]
    assert "--region=europe-west4 --display-name='census training'" in err
    assert run("jobs", "export", job_id, "--format", "vertex")[1] == out


def test_verbosity_error_keeps_stderr_quiet(run, stored):
    code, out, err = run("jobs", "convert", stored, "--verbosity", "error")
    assert code == 0 and out and err == ""


@pytest.mark.parametrize("argv, message", [
    ((), "Give one of JOB (a job in the store), --config FILE or --from-file FILE."),
    (("census_1", "--config", "c.yaml"), "not JOB and --config"),
    (("census_1", "--to", "ai-platform"), "JOB converts --to vertex only"),
    (("--from-file", "f.yaml", "--to", "vertex"), "--from-file converts --to ai-platform only"),
    (("census_1", "--module-name", "t.task"), "--module-name goes with --config"),
    (("census_1", "--", "--epochs", "1"), "-- ARGS goes with --config"),
    (("census_1", "--region", "us-east1"), "--region goes with --config or --from-file"),
    (("--from-file", "missing.yaml"), "--from-file file [missing.yaml] does not exist."),
    (("--config", "missing.yaml"), "--config file [missing.yaml] does not exist."),
    (("no_such_job",), "Job [no_such_job] not found"),
    (("census_1", "--to", "kubeflow"), "Invalid value for '--to'"),
])
def test_bad_input_is_one_line_and_exit_2(run, stored, argv, message):
    code, out, err = run("jobs", "convert", *argv)
    assert (code, out) == (2, "") and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("content, message", [
    ("[unclosed", "is not valid YAML or JSON at line 1"),
    ("- 1\n- 2\n", "must hold a CustomJob, a CustomJobSpec or a HyperparameterTuningJob"),
    ("displayName: x\njobSpec:\n  workerPoolSpecs:\n  - containerSpec: {imageUri: i}\n    replicaCount: 2\n",
     "jobSpec.workerPoolSpecs[0].replicaCount must be 1"),
    ("displayName: x\njobSpec: {workerPoolSpecs: [{replicaCount: 1, containerSpec: {imageUri: i}}], colour: red}\n",
     "jobSpec.colour: Extra inputs are not permitted"),
    ("workerPoolSpecs:\n- replicaCount: 1\n  pythonPackageSpec:\n    executorImageUri: gcr.io/p/own:1\n"
     "    packageUris: [gs://b/t.tar.gz]\n    pythonModule: t\n", "is not one of Vertex AI's prebuilt training images"),
])
def test_a_bad_vertex_file_is_one_line_naming_the_field(run, home, tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    code, out, err = run("jobs", "convert", "--from-file", str(path))
    assert (code, out) == (2, "") and message in err and len(err.strip().splitlines()) == 1


def test_the_cli_imports_the_vertex_dialect_only_when_converting():
    code = "import sys, aiptrain.cli, aiptrain.cli.jobs; print(any(m.startswith('aiptrain.vertex') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# -- Google's gcloud takes what `--gcloud-config` prints -------------------------------------------

class _Recorder(BaseHTTPRequestHandler):
    """Answers a create as the service does (the resource, named and PENDING) and keeps the body."""

    bodies: list[tuple[str, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        path = self.path.split("?")[0]
        self.bodies.append((path, body))
        answer = json.dumps({**body, "name": f"{path.removeprefix('/v1/')}/123", "state": "JOB_STATE_PENDING"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def gcloud(tmp_path):
    """run(*args) -> CompletedProcess of Google's gcloud, its aiplatform endpoint a recorder on a free port."""
    binary = shutil.which("gcloud")
    if binary is None:
        if IN_CI:
            pytest.fail("Google's gcloud is not on PATH (CI=true: this test must run)")
        pytest.skip("Google's gcloud is not on PATH (the google-cloud-cli package)")
    _Recorder.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    config = tmp_path / "gcloud-config"
    config.mkdir()
    (config / "gce").write_text("False")  # no metadata server to look for
    (tmp_path / "token").write_text("token")
    environment = {**{k: v for k, v in os.environ.items() if not k.startswith("CLOUDSDK_")},
                   "CLOUDSDK_CONFIG": str(config), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
                   "CLOUDSDK_CORE_PROJECT": "p", "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
                   "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
                   "CLOUDSDK_API_ENDPOINT_OVERRIDES_AIPLATFORM": f"http://127.0.0.1:{server.server_address[1]}/"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([binary, *args, f"--access-token-file={tmp_path / 'token'}"], env=environment,
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)

    yield run
    server.shutdown()
    server.server_close()
    thread.join()


def test_gcloud_creates_what_gcloud_config_prints_as_it_is(run, gcloud, tmp_path):
    config, study = tmp_path / "census.yaml", tmp_path / "study.yaml"
    config.write_text(CONFIG)
    study.write_text(TUNING)
    _, custom_spec, _ = run("jobs", "convert", "--config", str(config), "--module-name", "trainer.task", "--packages",
                            "gs://b/t-0.1.tar.gz", "--job-dir", "gs://b/out", "--gcloud-config")
    _, tuning_job, _ = run("jobs", "convert", "--config", str(study), "--runtime-version", "2.11",
                           "--scale-tier", "basic-gpu", "--gcloud-config")
    (tmp_path / "custom.yaml").write_text(custom_spec)
    (tmp_path / "tuning.yaml").write_text(tuning_job)

    created = gcloud("ai", "custom-jobs", "create", "--region=us-central1", "--display-name=census", "--config=custom.yaml")
    assert created.returncode == 0, created.stderr
    assert "CustomJob [projects/p/locations/us-central1/customJobs/123] is submitted successfully." in created.stderr
    created = gcloud("ai", "hp-tuning-jobs", "create", "--region=us-central1", "--display-name=study",
                     "--config=tuning.yaml")
    assert created.returncode == 0, created.stderr
    (custom_path, custom_body), (tuning_path, tuning_body) = _Recorder.bodies
    assert custom_path == "/v1/projects/p/locations/us-central1/customJobs"
    assert custom_body == {"displayName": "census", "jobSpec": yaml.safe_load(custom_spec)}
    assert tuning_path == "/v1/projects/p/locations/us-central1/hyperparameterTuningJobs"
    assert tuning_body == yaml.safe_load(tuning_job)


def test_gcloud_creates_a_stored_job_from_what_its_export_points_to(run, stored, gcloud, tmp_path):
    """`jobs export JOB --format vertex` prints the whole CustomJob, which `create --config` would
    send as a jobSpec holding a jobSpec: its hint names the jobSpec alone, as `jobs convert JOB
    --gcloud-config` prints it, and gcloud creates that job as it is."""
    code, exported, err = run("jobs", "export", stored, "--format", "vertex")
    assert code == 0 and "(FILE: the jobSpec alone, as `aiptrain jobs convert JOB --gcloud-config` prints it)" in err
    code, spec, _ = run("jobs", "convert", stored, "--gcloud-config")
    assert code == 0 and yaml.safe_load(spec) == yaml.safe_load(exported)["jobSpec"]
    (tmp_path / "spec.yaml").write_text(spec)
    created = gcloud("ai", "custom-jobs", "create", "--region=europe-west4", "--display-name=census_1",
                     "--config=spec.yaml")
    assert created.returncode == 0, created.stderr
    assert _Recorder.bodies == [("/v1/projects/p/locations/europe-west4/customJobs",
                                 {"displayName": "census_1", "jobSpec": yaml.safe_load(spec)})]

"""Submits as Google's gcloud 528 sends them, and the lines it refuses that older releases sent.

Recorded with the real gcloud 528 (`gcloud ai-platform jobs submit training ...` against a local
HTTP server that kept each POST body; docs/guide/submit.md says how): a --config file whose
TrainingInput fields are not under `trainingInput:` is posted with those fields at the top level
of the Job, which the service took; unsorted discreteValues are posted as written; a resumed
study may leave its params out. `--scale-tier custom` without `--master-machine-type` and a
command line with no region are refused by gcloud 528 before anything is sent: aiptrain takes
them, with one warning line each. No Docker: dry runs, the REST body parser and prepare().
"""

from __future__ import annotations

import json

import pytest
import yaml

from aiptrain import gcloud_properties
from aiptrain.api.jobs import _job_body
from aiptrain.client import Client
from aiptrain.config import SubmitFlags
from aiptrain.model import Job, State, TrainingOutput

from test_rest_api import GOOD_BODY, PROJECT, api_home, assert_refused_and_nothing_created, raw, serve  # noqa: F401

# What gcloud 528 posted for `jobs submit training j1 --config c.yaml --module-name m --packages
# gs://bucket/p.tar.gz --region us-central1`, c.yaml holding scaleTier, masterType and
# hyperparameters at its top level (the body as recorded, keys in gcloud's order).
GCLOUD_528_BODY = {
    "hyperparameters": {"goal": "MAXIMIZE", "params": [
        {"discreteValues": [3, 1, 2], "parameterName": "lr", "type": "DISCRETE"}]},
    "jobId": "j1", "masterType": "n1-standard-8", "scaleTier": "CUSTOM",
    "trainingInput": {"enableWebAccess": False, "packageUris": ["gs://bucket/p.tar.gz"], "pythonModule": "m",
                      "region": "us-central1"},
}
# The same job with its fields where the service documents them.
DOCUMENTED_BODY = {
    "jobId": "j1",
    "trainingInput": {"scaleTier": "CUSTOM", "masterType": "n1-standard-8", "hyperparameters": {
        "goal": "MAXIMIZE", "params": [{"parameterName": "lr", "type": "DISCRETE", "discreteValues": [3, 1, 2]}]},
        "enableWebAccess": False, "packageUris": ["gs://bucket/p.tar.gz"], "pythonModule": "m",
        "region": "us-central1"},
}


@pytest.fixture(autouse=True)
def no_region_property(monkeypatch):
    """No compute/region from this machine's environment: the tests say when there is one."""
    monkeypatch.delenv("CLOUDSDK_COMPUTE_REGION", raising=False)


def dry_run(run, tmp_path, package, config: str | None, *flags: str, job_id: str = "j1"):
    """(exit status, the plan, stderr's lines) of a dry-run submit with `config` as its --config."""
    args = ["jobs", "submit", "training", job_id, "--packages", str(package), "--module-name", "trainer.task",
            "--dry-run", *flags]
    if config is not None:
        path = tmp_path / f"config-{abs(hash(config))}.yaml"
        path.write_text(config)
        args += ["--config", str(path)]
    code, out, err = run(*args)
    return code, (yaml.safe_load(out) if code == 0 else None), err.splitlines()


def tf_job(plan: dict) -> dict:
    return json.loads(plan["containers"][0]["env"]["TF_CONFIG"])["job"]


# -- 1. TrainingInput fields at the top level of a --config file or a REST body ------------------

# (config with top-level fields, the same config under trainingInput)
CONFIGS = [
    ("scaleTier: CUSTOM\nmasterType: n1-standard-8\nworkerType: n1-standard-4\nworkerCount: 2\n",
     "trainingInput: {scaleTier: CUSTOM, masterType: n1-standard-8, workerType: n1-standard-4, workerCount: 2}\n"),
    ("scaleTier: STANDARD_1\nargs: [--epochs, '3']\n", "trainingInput: {scaleTier: STANDARD_1, args: [--epochs, '3']}\n"),
    ("hyperparameters:\n  algorithm: GRID_SEARCH\n  params:\n  - {parameterName: n, type: DISCRETE, discreteValues: [4, 2]}\n",
     "trainingInput:\n  hyperparameters:\n    algorithm: GRID_SEARCH\n    params:\n"
     "    - {parameterName: n, type: DISCRETE, discreteValues: [4, 2]}\n"),
    ("masterType: n1-standard-8\ntrainingInput: {scaleTier: CUSTOM}\n",
     "trainingInput: {scaleTier: CUSTOM, masterType: n1-standard-8}\n"),
]


@pytest.mark.parametrize("top_level, documented", CONFIGS)
def test_a_config_without_training_input_runs_the_job_it_would_under_it(run, tmp_path, package, top_level,
                                                                       documented):
    code, plan, err = dry_run(run, tmp_path, package, top_level, "--region", "us-central1")
    assert code == 0, err
    assert (code, plan, err) == dry_run(run, tmp_path, package, documented, "--region", "us-central1")
    assert err == []  # gcloud 528 sends it: nothing to warn about


def test_the_body_gcloud_528_posts_is_the_job_it_describes_under_training_input(home):
    sent, documented = _job_body(GCLOUD_528_BODY), _job_body(DOCUMENTED_BODY)
    assert sent == documented
    assert sent.to_resource()["trainingInput"]["masterType"] == "n1-standard-8"
    with Client() as client:
        prepared = [client.prepare(SubmitFlags(job_id="j1", project=PROJECT), base=job) for job in (sent, documented)]
    assert prepared[0].job == prepared[1].job and prepared[0].replicas == prepared[1].replicas
    assert not [notice for notice in prepared[0].notices if "gcloud 528" in notice]  # a REST body is no command line
    # discreteValues stay as sent
    params = prepared[0].job.to_resource()["trainingInput"]["hyperparameters"]["params"]
    assert params[0]["discreteValues"] == [3, 1, 2]


@pytest.mark.parametrize("body, words", [
    ({**GOOD_BODY, "workerCount": "many"}, "trainingInput.workerCount"),
    ({**GOOD_BODY, "scaleTier": "HUGE"}, "trainingInput.scaleTier"),
    ({**GOOD_BODY, "scaleTeir": "CUSTOM"}, "scaleTeir"),  # no field of the Job nor of its TrainingInput
])
def test_a_rest_create_checks_top_level_training_fields_as_under_training_input(serve, api_home, body, words):  # noqa: F811
    assert_refused_and_nothing_created(serve, api_home, "POST", f"/v1/projects/{PROJECT}/jobs",
                                       json.dumps(body).encode(), {}, 400, words)


# -- 4. what gcloud 528 refuses before sending, which older releases sent: one warning each -------

NO_MASTER = ("WARNING: gcloud 528 would refuse this command line: --scale-tier custom requires --master-machine-type, "
             "even where the --config file sets masterType; add --master-machine-type n1-standard-8.")
NO_MASTER_IN_CONFIG = ("WARNING: gcloud 528 would refuse this command line: scaleTier: custom in the --config file "
                       "requires --master-machine-type, even where the --config file sets masterType; add "
                       "--master-machine-type n1-standard-8.")
NO_REGION = ("WARNING: gcloud 528 would refuse this command line: it requires --region or the compute/region "
             "property; add --region us-central1 (the region this job records).")
NO_REGION_WITH_CONFIG = ("WARNING: gcloud 528 would refuse this command line: it requires --region or the "
                         "compute/region property, even where the --config file sets region; add --region {region} "
                         "(the region this job records).")
MASTER = "trainingInput: {masterType: n1-standard-8}\n"
TOP_MASTER = "masterType: n1-standard-8\n"

# (--config text or None, flags, the warning lines): gcloud 528's verdict recorded for each line
GCLOUD_LINES = [
    (MASTER, ["--scale-tier", "custom", "--region", "r"], [NO_MASTER]),  # gcloud: refused
    (MASTER, ["--scale-tier", "CUSTOM", "--region", "r"], [NO_MASTER]),  # gcloud: refused
    (TOP_MASTER, ["--scale-tier", "custom", "--region", "r"], [NO_MASTER]),  # gcloud: refused
    ("trainingInput: {scaleTier: custom, masterType: n1-standard-8}\n", ["--region", "r"],
     [NO_MASTER_IN_CONFIG]),  # gcloud reads the config's tier spelled as its flag's choice: refused
    ("trainingInput: {scaleTier: CUSTOM, masterType: n1-standard-8}\n", ["--region", "r"], []),  # gcloud: sent
    ("scaleTier: custom\nmasterType: n1-standard-8\n", ["--region", "r"], []),  # gcloud: sent (top level unread)
    (MASTER, ["--scale-tier", "custom", "--master-machine-type", "n1-standard-4", "--region", "r"], []),  # sent
    (None, [], [NO_REGION]),  # gcloud: "The required property [region] is not currently set."
    ("trainingInput: {region: europe-west1}\n", [], [NO_REGION_WITH_CONFIG.format(region="europe-west1")]),
    (None, ["--region", "us-central1"], []),  # gcloud: sent
    (MASTER, ["--scale-tier", "custom"], [NO_MASTER, NO_REGION_WITH_CONFIG.format(region="us-central1")]),
]


@pytest.mark.parametrize("config, flags, warnings", GCLOUD_LINES)
def test_lines_gcloud_528_refuses_are_taken_with_one_warning_each(run, tmp_path, package, config, flags, warnings):
    code, plan, err = dry_run(run, tmp_path, package, config, *flags)
    assert code == 0, err
    assert err == warnings


def test_a_region_property_is_a_region_for_gcloud(run, home, tmp_path, package, monkeypatch):
    monkeypatch.setenv("CLOUDSDK_COMPUTE_REGION", "asia-east1")
    code, plan, err = dry_run(run, tmp_path, package, None)
    assert (code, err, tf_job(plan)["region"]) == (0, [], "asia-east1")
    monkeypatch.delenv("CLOUDSDK_COMPUTE_REGION")
    home.mkdir(parents=True, exist_ok=True)  # what `gcloud config set compute/region` through the shim stores
    (home / gcloud_properties.FILE_NAME).write_text(json.dumps({"compute/region": "europe-west4"}))
    code, plan, err = dry_run(run, tmp_path, package, None)
    assert (code, err, tf_job(plan)["region"]) == (0, [], "europe-west4")


def test_the_warnings_go_with_verbosity_error(run, tmp_path, package):
    code, _, err = dry_run(run, tmp_path, package, MASTER, "--scale-tier", "custom", "--verbosity", "error")
    assert (code, err) == (0, [])


# -- 3. a resumed study without params takes the previous job's ----------------------------------

PREVIOUS_SPEC = {"goal": "MINIMIZE", "hyperparameterMetricTag": "loss", "algorithm": "GRID_SEARCH", "maxTrials": 2,
                 "params": [{"parameterName": "units", "type": "INTEGER", "minValue": 8, "maxValue": 9},
                            {"parameterName": "layers", "type": "DISCRETE", "discreteValues": [4, 1]}]}


def seed_study(job_id: str, spec: dict | None = PREVIOUS_SPEC, state: State = State.SUCCEEDED,
               project: str | None = None) -> None:
    """A tuning job that ended, straight into the store."""
    with Client(project=project) as client:
        training_input = {"hyperparameters": spec} if spec else {}
        client.store.create(Job.model_validate({"jobId": job_id, "trainingInput": training_input}),
                            project=client.project)
        key = client.key(job_id)
        client.store.set_training_output(key, TrainingOutput(is_hyperparameter_tuning_job=True))
        if state is not State.QUEUED:
            client.store.transition(key, state, [State.QUEUED])


def test_a_resumed_study_without_params_runs_the_previous_jobs(run, tmp_path, package):
    seed_study("first_half")
    config = "trainingInput:\n  hyperparameters: {resumePreviousJobId: first_half, maxTrials: 3}\n"
    code, plan, err = dry_run(run, tmp_path, package, config, "--region", "r", job_id="second_half")
    assert (code, err) == (0, [])
    command = plan["containers"][0]["command"]
    assert any(arg.startswith("--units=") for arg in command) and any(arg.startswith("--layers=") for arg in command)
    with Client() as client:
        flags = SubmitFlags(job_id="second_half", config=str(next(tmp_path.glob("config-*.yaml"))), region="r",
                            packages=[str(package)], module_name="trainer.task")
        spec = client.prepare(flags).job.to_resource()["trainingInput"]["hyperparameters"]
    assert spec == {"goal": "MINIMIZE", "hyperparameterMetricTag": "loss", "algorithm": "GRID_SEARCH",
                    "maxTrials": "3", "resumePreviousJobId": "first_half",
                    "params": [{"parameterName": "units", "type": "INTEGER", "minValue": 8.0, "maxValue": 9.0},
                               {"parameterName": "layers", "type": "DISCRETE", "discreteValues": [4.0, 1.0]}]}


@pytest.mark.parametrize("seeded, resumes, message", [
    (None, "nope", "trainingInput.hyperparameters.resumePreviousJobId [nope] is not a hyperparameter tuning job "
                   "here: name one that `aiptrain jobs list` shows, or leave it out."),
    ({"spec": None}, "plain", "trainingInput.hyperparameters.resumePreviousJobId [plain] is not a hyperparameter "
                              "tuning job here"),
    ({"spec": {"params": [{"parameterName": "lr", "type": "DOUBLE", "minValue": 0.1, "maxValue": 1}]}}, "doubles",
     "trainingInput.hyperparameters with the study of resumePreviousJobId [doubles]: params[0] (lr): GRID_SEARCH "
     "takes INTEGER, CATEGORICAL or DISCRETE parameters"),
])
def test_a_resumed_study_names_a_tuning_job_whose_study_fits(run, tmp_path, package, seeded, resumes, message):
    if seeded is not None:
        seed_study(resumes, **seeded)
    config = f"trainingInput:\n  hyperparameters: {{resumePreviousJobId: {resumes}, algorithm: GRID_SEARCH}}\n"
    code, _, err = dry_run(run, tmp_path, package, config, "--region", "r")
    assert code == 2 and len(err) == 1 and err[0].startswith("ERROR: " + message), err


def test_a_dry_run_of_a_resumed_study_in_a_new_home_makes_no_store(run, tmp_path, package, home):
    config = "trainingInput:\n  hyperparameters: {resumePreviousJobId: nope}\n"
    assert dry_run(run, tmp_path, package, config, "--region", "r")[0] == 2
    assert not (home / "jobs.db").exists()


def test_a_rest_create_resumes_only_a_study_of_its_own_project(serve, api_home):  # noqa: F811
    seed_study("theirs", project="team-b")
    seed_study("ours", project=PROJECT)

    def body(previous: str) -> dict:
        return {**GOOD_BODY, "trainingInput": {**GOOD_BODY["trainingInput"],
                                               "hyperparameters": {"resumePreviousJobId": previous}}}

    status, answer = raw(serve(), "POST", f"/v1/projects/{PROJECT}/jobs", json.dumps(body("theirs")).encode(),
                         {"Content-Length": str(len(json.dumps(body("theirs"))))})
    assert status == 400 and "resumePreviousJobId [theirs] is not a hyperparameter tuning job" in \
        answer["error"]["message"]
    with Client(project=PROJECT) as client:  # what the create above asked: the job, if it is the project's
        assert client.job_ids() == ["ours"]
        assert client._stored_job("theirs") is None
        prepared = client.prepare(SubmitFlags(job_id="fresh", project=PROJECT), _job_body(body("ours")))
    assert [p.parameter_name for p in prepared.job.training_input.hyperparameters.params] == ["units", "layers"]

"""Hyperparameter tuning studies on the real engine: trials as replicas, the search, failures,
early stopping, cancel, a killed controller and resumed studies."""

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import yaml

from aiptrain.jobpaths import JobPaths

from conftest import REPO, job_resources, kill_controller, wait_for

TUNER = Path(__file__).parents[1] / "trainers" / "tuner"
HPTUNING_SAMPLE = REPO / "sample_jobs" / "hptuning"


@pytest.fixture
def study(tmp_path, cli, minimal_runtime, monkeypatch):
    """Submit a study of the tuner trainer: `study(job_id, spec, *user_args, wait=True)`."""
    monkeypatch.setenv("AIPTRAIN_POLL_SECONDS", "0.2")

    def submit(job_id, spec, *user_args, wait=True, trainer=TUNER, module="tuner.task", code=None):
        config = tmp_path / f"{job_id}.yaml"
        config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": spec}}))
        args = ["jobs", "submit", "training", job_id, "--config", str(config), "--package-path", str(trainer),
                "--module-name", module, "--job-dir", str(tmp_path / job_id), "--region", "us-central1",
                "--runtime-version", minimal_runtime]
        if wait:
            args.append("--stream-logs")
        return cli(*args, "--", *user_args, timeout=600, check_code=code)

    return submit


def describe(cli, job_id):
    return yaml.safe_load(cli("jobs", "describe", job_id, check_code=0).stdout)


def trials_of(job):
    return {t["trialId"]: t for t in job.get("trainingOutput", {}).get("trials", [])}


def grid(name, values, kind="CATEGORICAL"):
    if kind == "CATEGORICAL":
        return {"parameterName": name, "type": kind, "categoricalValues": values}
    return {"parameterName": name, "type": kind, "discreteValues": values}


def test_grid_search_visits_every_point_once_and_minimize_finds_the_smallest(cli, study, docker_api, tmp_path):
    spec = {"goal": "MINIMIZE", "algorithm": "GRID_SEARCH", "maxTrials": 10, "maxParallelTrials": 4,
            "params": [{"parameterName": "n", "type": "INTEGER", "minValue": 1, "maxValue": 2},
                       grid("c", ["a", "b"])]}
    result = study("grid_min", spec, code=0)
    assert "state: SUCCEEDED" in result.stdout
    job = describe(cli, "grid_min")
    output = job["trainingOutput"]
    assert output["isHyperparameterTuningJob"] is True
    assert output["completedTrialCount"] == "4"  # maxTrials 10, capped at the grid's 4 points
    assert output["hyperparameterMetricTag"] == "training/hptuning/metric"
    trials = trials_of(job)
    assert sorted(trials) == ["1", "2", "3", "4"]
    points = sorted((t["hyperparameters"]["n"], t["hyperparameters"]["c"]) for t in trials.values())
    assert points == [("1", "a"), ("1", "b"), ("2", "a"), ("2", "b")]
    for trial_id, trial in trials.items():
        assert trial["state"] == "SUCCEEDED"
        assert trial["finalMetric"] == {"objectiveValue": float(trial["hyperparameters"]["n"]), "trainingStep": "1"}
        assert trial["startTime"] <= trial["endTime"]
        # Each trial wrote into its own job dir, <jobDir>/<trialId>.
        assert (tmp_path / "grid_min" / trial_id / "objective.txt").read_text() == trial["hyperparameters"]["n"] + ".0"
    logs = result.stderr.splitlines()
    assert any(line.split("\t")[2:4] == ["master-replica-0", "3"] for line in logs if line.count("\t") >= 4)
    summary = cli("jobs", "describe", "grid_min", "--summarize", check_code=0).stdout
    assert "Training Output Trials" in summary
    assert job_resources(docker_api, "grid_min") == []


def test_a_study_fails_once_max_failed_trials_trials_failed(cli, study, docker_api):
    spec = {"maxTrials": 4, "maxParallelTrials": 1, "maxFailedTrials": 1, "algorithm": "RANDOM_SEARCH",
            "params": [grid("c", ["bad", "worse"])]}
    result = study("all_fail", spec, "--fail-on", "bad", code=1)
    assert "state: FAILED" in result.stdout
    job = describe(cli, "all_fail")
    trials = trials_of(job)
    failed = [t for t in trials.values() if t["state"] == "FAILED"]
    assert failed and all(t["hyperparameters"]["c"] == "bad" for t in failed)
    assert job["errorMessage"].startswith("The hyperparameter tuning job failed: 1 of the trials failed (the limit is 1).")
    assert f"Failed trials: {failed[0]['trialId']}." in job["errorMessage"]
    assert "failing because c=bad" in result.stderr  # the failed replica's output reached the log
    assert job_resources(docker_api, "all_fail") == []


def test_random_search_keeps_going_past_failed_trials_below_the_limit(cli, study, docker_api):
    spec = {"maxTrials": 5, "maxParallelTrials": 3, "maxFailedTrials": 5, "algorithm": "RANDOM_SEARCH",
            "params": [{"parameterName": "x", "type": "DOUBLE", "minValue": 0.5, "maxValue": 2.5},
                       grid("c", ["good", "bad"])]}
    result = study("some_fail", spec, "--fail-on", "bad")
    job = describe(cli, "some_fail")
    trials = trials_of(job)
    assert len(trials) == 5
    for trial in trials.values():
        assert 0.5 <= float(trial["hyperparameters"]["x"]) <= 2.5
        assert trial["state"] == ("FAILED" if trial["hyperparameters"]["c"] == "bad" else "SUCCEEDED")
    succeeded = [t for t in trials.values() if t["state"] == "SUCCEEDED"]
    assert job["state"] == ("SUCCEEDED" if succeeded else "FAILED")
    assert result.returncode == (0 if succeeded else 1)
    assert job["trainingOutput"]["completedTrialCount"] == str(len(succeeded))


def test_cancel_mid_study_stops_every_trial_and_leaves_nothing(cli, study, docker_api, home):
    spec = {"maxTrials": 6, "maxParallelTrials": 2, "params": [grid("c", ["a", "b"])]}
    study("cancel_me", spec, "--reports", "600", "--sleep", "0.5", wait=False, code=0)
    wait_for(lambda: len(docker_api.containers(filters={"label": "aiptrain.job-id=cancel_me",
                                                        "status": "running"})) == 2,
             timeout=120, what="two trials running")
    cli("jobs", "cancel", "cancel_me", check_code=0)
    job = describe(cli, "cancel_me")
    assert job["state"] == "CANCELLED"
    assert {t["state"] for t in trials_of(job).values()} == {"CANCELLED"}
    assert job_resources(docker_api, "cancel_me") == []
    assert not JobPaths(home, "cancel_me").work_dir.exists()


def test_a_killed_controller_is_replaced_and_the_study_loses_no_trial(cli, study, docker_api, home):
    spec = {"maxTrials": 4, "maxParallelTrials": 2, "algorithm": "GRID_SEARCH",
            "params": [{"parameterName": "n", "type": "INTEGER", "minValue": 1, "maxValue": 4}]}
    study("orphan_study", spec, "--reports", "3", "--sleep", "1", wait=False, code=0)
    wait_for(lambda: len(trials_of(describe(cli, "orphan_study"))) >= 2, timeout=120, what="two trials")
    assert kill_controller(home) == 1
    job = wait_for(lambda: (lambda j: j if j["state"] in ("SUCCEEDED", "FAILED") else None)(
        describe(cli, "orphan_study")), timeout=240, what="the study to end")
    assert job["state"] == "SUCCEEDED", job.get("errorMessage")
    trials = trials_of(job)
    assert sorted(trials) == ["1", "2", "3", "4"]
    assert sorted(t["hyperparameters"]["n"] for t in trials.values()) == ["1", "2", "3", "4"]  # no point twice
    assert {t["state"] for t in trials.values()} == {"SUCCEEDED"}
    assert job_resources(docker_api, "orphan_study") == []


def test_early_stopping_stops_trials_that_trail_the_others(cli, study, docker_api):
    spec = {"maxTrials": 6, "maxParallelTrials": 1, "algorithm": "GRID_SEARCH", "enableTrialEarlyStopping": True,
            "params": [grid("x", [1, 2, 3, 4, 5, 6], "DISCRETE")]}
    study("early", spec, "--reports", "8", "--sleep", "0.4", code=0)
    trials = trials_of(describe(cli, "early")).values()
    stopped = [t for t in trials if t.get("isTrialStoppedEarly")]
    assert stopped, trials
    finished = [t for t in trials if not t.get("isTrialStoppedEarly")]
    assert all(t["state"] == "SUCCEEDED" for t in trials)
    # A stopped trial's last report is below the best finished trial's final metric.
    best = max(t["finalMetric"]["objectiveValue"] for t in finished)
    assert all(t["finalMetric"]["objectiveValue"] < best for t in stopped)


PARAMS_N = [{"parameterName": "n", "type": "INTEGER", "minValue": 1, "maxValue": 3}]


# The resumed spec in full, or as short as the service took it: the study (params, algorithm)
# comes from the previous job.
@pytest.mark.parametrize("resumed", [{"algorithm": "GRID_SEARCH", "params": PARAMS_N}, {}])
def test_resume_previous_job_id_continues_the_grid(cli, study, docker_api, resumed):
    study("first_half", {"algorithm": "GRID_SEARCH", "maxTrials": 2, "maxParallelTrials": 2, "params": PARAMS_N},
          code=0)
    before = {t["hyperparameters"]["n"] for t in trials_of(describe(cli, "first_half")).values()}
    assert len(before) == 2
    spec = {**resumed, "maxTrials": 3, "maxParallelTrials": 2, "resumePreviousJobId": "first_half"}
    study("second_half", spec, code=0)
    job = describe(cli, "second_half")
    after = trials_of(job)
    assert [t["hyperparameters"]["n"] for t in after.values()] == list({"1", "2", "3"} - before)
    hyperparameters = job["trainingInput"]["hyperparameters"]
    assert hyperparameters["algorithm"] == "GRID_SEARCH" and [p["parameterName"] for p in hyperparameters["params"]] \
        == ["n"]


def test_resume_previous_job_id_must_name_a_tuning_job(study):
    spec = {"maxTrials": 1, "params": [grid("c", ["a"])], "resumePreviousJobId": "nope"}
    result = study("resumes_nothing", spec, code=2)
    assert result.stderr.strip().splitlines() == [
        "ERROR: trainingInput.hyperparameters.resumePreviousJobId [nope] is not a hyperparameter tuning job "
        "here: name one that `aiptrain jobs list` shows, or leave it out."
    ]


def test_the_hptuning_sample_finds_the_best_trial_with_real_cloudml_hypertune(cli, tmp_path, minimal_runtime,
                                                                               monkeypatch):
    job_dir = tmp_path / "tune_1"
    result = cli("jobs", "submit", "training", "tune_1", "--config", str(HPTUNING_SAMPLE / "hptuning.yaml"),
                 "--package-path", str(HPTUNING_SAMPLE / "trainer"), "--module-name", "trainer.task",
                 "--job-dir", str(job_dir), "--region", "us-central1", "--runtime-version", minimal_runtime,
                 "--stream-logs", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    job = describe(cli, "tune_1")
    trials = trials_of(job)
    assert len(trials) == 6 and job["trainingOutput"]["completedTrialCount"] == "6"
    spec = importlib.util.spec_from_file_location("sample_task", HPTUNING_SAMPLE / "trainer" / "task.py")
    sample = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "hypertune", types.ModuleType("hypertune"))  # only score() is used here
    spec.loader.exec_module(sample)

    def expected(trial):
        values = trial["hyperparameters"]
        return sample.score(float(values["learning_rate"]), int(values["hidden_units"]), values["optimizer"])

    for trial_id, trial in trials.items():
        assert trial["finalMetric"]["objectiveValue"] == pytest.approx(expected(trial))
        assert trial["finalMetric"]["trainingStep"] == "300"
        result_file = json.loads((job_dir / trial_id / "result.json").read_text())
        assert result_file["trial"] == trial_id
    best = max(trials.values(), key=lambda t: t["finalMetric"]["objectiveValue"])
    assert best is max(trials.values(), key=expected)

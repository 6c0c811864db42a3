"""trainingInput.hyperparameters: the typed spec, its one-line validation errors, and the
trainingOutput trials on the wire (reference aiplatform.md §8)."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from aiptrain.config import SubmitFlags, build_job, load_config
from aiptrain.errors import ValidationError
from aiptrain.model import (
    Algorithm,
    Goal,
    HyperparameterSpec,
    Job,
    ParameterType,
    ScaleType,
)

from conftest import SAMPLE_TRAINER

LR = {"parameterName": "learning_rate", "type": "DOUBLE", "minValue": 0.001, "maxValue": 0.1}
UNITS = {"parameterName": "units", "type": "INTEGER", "minValue": 8, "maxValue": 64}
CELL = {"parameterName": "cell", "type": "CATEGORICAL", "categoricalValues": ["lstm", "gru"]}
LAYERS = {"parameterName": "layers", "type": "DISCRETE", "discreteValues": [1, 2, 4]}
WHERE = "trainingInput.hyperparameters"


def with_(param: dict, **changes) -> dict:
    merged = {**param, **changes}
    return {key: value for key, value in merged.items() if value is not None}


# (hyperparameters, where the error points, what it says)
INVALID = [
    ({}, f"{WHERE}.params", "at least one parameter is required"),
    ({"params": []}, f"{WHERE}.params", "at least one parameter is required"),
    ({"params": [with_(LR, parameterName=None)]}, f"{WHERE}.params[0]", "parameterName is required"),
    ({"params": [with_(LR, parameterName="1rate")]}, f"{WHERE}.params[0] (1rate)", "must be a flag name"),
    ({"params": [LR, with_(UNITS, parameterName="learning_rate")]}, f"{WHERE}.params[1] (learning_rate)",
     "used twice"),
    ({"params": [with_(LR, type=None)]}, f"{WHERE}.params[0] (learning_rate)", "type is required"),
    ({"params": [with_(LR, type="PARAMETER_TYPE_UNSPECIFIED")]}, f"{WHERE}.params[0] (learning_rate)",
     "type is required"),
    ({"params": [with_(LR, type="FLOAT")]}, f"{WHERE}.params[0].type", "[FLOAT] is not a parameter type: use one of"),
    ({"params": [UNITS, with_(LR, minValue=0.5)]}, f"{WHERE}.params[1] (learning_rate)",
     "minValue must be less than maxValue"),
    ({"params": [with_(LR, maxValue=None)]}, f"{WHERE}.params[0] (learning_rate)", "needs both minValue and maxValue"),
    ({"params": [with_(UNITS, minValue=1.5)]}, f"{WHERE}.params[0] (units)", "INTEGER needs whole numbers"),
    ({"params": [with_(LR, categoricalValues=["a"])]}, f"{WHERE}.params[0] (learning_rate)",
     "DOUBLE takes minValue and maxValue"),
    ({"params": [with_(CELL, categoricalValues=[])]}, f"{WHERE}.params[0] (cell)", "non-empty categoricalValues"),
    ({"params": [with_(CELL, categoricalValues=["a", "a"])]}, f"{WHERE}.params[0] (cell)",
     "categoricalValues must be unique"),
    ({"params": [with_(CELL, minValue=1)]}, f"{WHERE}.params[0] (cell)", "CATEGORICAL takes categoricalValues only"),
    ({"params": [with_(CELL, scaleType="UNIT_LINEAR_SCALE")]}, f"{WHERE}.params[0] (cell)",
     "scaleType does not apply to CATEGORICAL"),
    ({"params": [with_(LAYERS, discreteValues=[])]}, f"{WHERE}.params[0] (layers)", "non-empty discreteValues"),
    ({"params": [with_(LAYERS, discreteValues=[4, 1, 4, 2, 1])]}, f"{WHERE}.params[0] (layers)",
     "discreteValues must not repeat a value ([1, 4] more than once)"),
    ({"params": [with_(LAYERS, discreteValues=[1, 1.0])]}, f"{WHERE}.params[0] (layers)", "must not repeat a value"),
    ({"params": [with_(LAYERS, discreteValues=list(range(1001)))]}, f"{WHERE}.params[0] (layers)",
     "at most 1000"),
    ({"params": [with_(LAYERS, discreteValues=[1, 0], scaleType="UNIT_LOG_SCALE")]}, f"{WHERE}.params[0] (layers)",
     "every discreteValue greater than 0"),
    ({"params": [with_(LR, minValue=0, scaleType="UNIT_LOG_SCALE")]}, f"{WHERE}.params[0] (learning_rate)",
     "UNIT_LOG_SCALE needs minValue greater than 0"),
    ({"params": [with_(LR, minValue=-1, scaleType="UNIT_REVERSE_LOG_SCALE")]}, f"{WHERE}.params[0] (learning_rate)",
     "UNIT_REVERSE_LOG_SCALE needs minValue greater than 0"),
    ({"params": [with_(LR, scaleType="LOG")]}, f"{WHERE}.params[0].scaleType", "[LOG] is not a scale type"),
    ({"maxTrials": 0, "params": [LR]}, f"{WHERE}.maxTrials", "must be at least 1"),
    ({"maxParallelTrials": "0", "params": [LR]}, f"{WHERE}.maxParallelTrials", "must be at least 1"),
    ({"maxFailedTrials": -1, "params": [LR]}, f"{WHERE}.maxFailedTrials", "must be at least 0"),
    # 5,000 trials at once was accepted: 5,000 containers (issue 21.10)
    ({"maxTrials": 5000, "params": [LR]}, f"{WHERE}.maxTrials", "is 5000; aiptrain runs at most 1000"),
    ({"maxParallelTrials": 5000, "params": [LR]}, f"{WHERE}.maxParallelTrials", "is 5000; aiptrain runs at most 100"),
    ({"maxFailedTrials": 5000, "params": [LR]}, f"{WHERE}.maxFailedTrials", "aiptrain runs at most 1000"),
    ({"maxTrials": "many", "params": [LR]}, f"{WHERE}.maxTrials", "valid integer"),
    ({"algorithm": "GRID_SEARCH", "params": [UNITS, LR]}, f"{WHERE}.params[1] (learning_rate)",
     "GRID_SEARCH takes INTEGER, CATEGORICAL or DISCRETE"),
    ({"algorithm": "GRID_SEARCH", "params": [with_(UNITS, maxValue=10**6)]}, f"{WHERE}.params",
     "GRID_SEARCH takes at most"),
    ({"algorithm": "BAYESIAN", "params": [LR]}, f"{WHERE}.algorithm",
     "use one of ALGORITHM_UNSPECIFIED, GRID_SEARCH, RANDOM_SEARCH"),
    ({"goal": "BIGGER", "params": [LR]}, f"{WHERE}.goal", "use one of GOAL_TYPE_UNSPECIFIED, MAXIMIZE, MINIMIZE"),
    ({"params": [with_(LR, minvalue=0.1)]}, f"{WHERE}.params[0].minvalue", "Extra inputs are not permitted"),
    ({"enableTrialEarlyStopping": "perhaps", "params": [LR]}, f"{WHERE}.enableTrialEarlyStopping", "valid boolean"),
    ({"params": {"learning_rate": LR}}, f"{WHERE}.params", "valid list"),
]


def write_config(tmp_path, hyperparameters) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": hyperparameters}}))
    return str(path)


@pytest.mark.parametrize("hyperparameters, where, says", INVALID)
def test_invalid_spec_is_one_line_naming_the_field(tmp_path, hyperparameters, where, says):
    path = write_config(tmp_path, hyperparameters)
    with pytest.raises(ValidationError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"Invalid --config file [{path}]: {where}: "), message
    assert says in message
    assert "\n" not in message and message.endswith(".") and "Value error" not in message


def test_corpus_is_big_enough():
    assert len(INVALID) >= 20


@pytest.mark.parametrize("index", [0, 4, 8, 15, 24, 28])
def test_invalid_spec_through_the_cli(cli, home, tmp_path, index):
    hyperparameters, where, says = INVALID[index]
    path = write_config(tmp_path, hyperparameters)
    result = cli("jobs", "submit", "training", "hp_bad", "--config", path, "--package-path", str(SAMPLE_TRAINER),
                 "--module-name", "trainer.task", "--region", "us-central1", "--job-dir", str(tmp_path / "out"),
                 "--dry-run")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"ERROR: Invalid --config file [{path}]: {where}: ") and says in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (home / "jobs.db").exists() and not list(home.rglob("*.db"))
    assert not (tmp_path / "out").exists()


REAL_WORLD = """
trainingInput:
  scaleTier: BASIC
  hyperparameters:
    goal: maximize
    hyperparameterMetricTag: accuracy
    maxTrials: '30'
    maxParallelTrials: 2
    maxFailedTrials: "3"
    enableTrialEarlyStopping: TRUE
    algorithm: random_search
    params:
    - parameterName: learning_rate
      type: double
      minValue: '0.0001'
      maxValue: 0.1
      scaleType: unit_log_scale
    - {parameterName: hidden1, type: INTEGER, minValue: 40, maxValue: 400, scaleType: UNIT_LINEAR_SCALE}
    - {parameterName: numRnnCells, type: DISCRETE, discreteValues: [1, '2', 3, 4]}
    - {parameterName: batch, type: CATEGORICAL, categoricalValues: [32, 64, big]}
"""


def test_a_real_world_config_loads(tmp_path):
    path = tmp_path / "hptuning.yaml"
    path.write_text(REAL_WORLD)
    hp = load_config(str(path)).training_input.hyperparameters
    assert (hp.goal, hp.algorithm, hp.max_trials, hp.max_parallel_trials, hp.max_failed_trials) == (
        Goal.MAXIMIZE, Algorithm.RANDOM_SEARCH, 30, 2, 3)
    assert hp.enable_trial_early_stopping is True
    lr, hidden, cells, batch = hp.params
    assert (lr.type, lr.min_value, lr.scale_type) == (ParameterType.DOUBLE, 0.0001, ScaleType.UNIT_LOG_SCALE)
    assert cells.discrete_values == [1, 2, 3, 4]
    assert batch.categorical_values == ["32", "64", "big"]
    assert hp.metric_tag == "accuracy" and hp.trials_limit == 30 and hp.parallel_limit == 2


# discreteValues as gcloud sends them (in the order written) and the service took them: kept so
# in the resource, sorted for the search; a value listed twice is still refused (Vizier does).
DISCRETE_ORDERS = [
    ([1, 2, 4], [1, 2, 4]),
    ([4, 2, 1], [1, 2, 4]),
    ([2, 0.5, 8, 1], [0.5, 1, 2, 8]),
    ([-1, -3, 2], [-3, -1, 2]),
    ([3], [3]),
]


@pytest.mark.parametrize("written, searched", DISCRETE_ORDERS)
def test_discrete_values_in_any_order_are_kept_as_sent_and_searched_sorted(tmp_path, written, searched):
    path = write_config(tmp_path, {"algorithm": "GRID_SEARCH", "params": [with_(LAYERS, discreteValues=written)]})
    job = load_config(path)
    layers = job.training_input.hyperparameters.params[0]
    assert job.to_resource()["trainingInput"]["hyperparameters"]["params"][0]["discreteValues"] == written
    assert layers.choices == layers.grid_values == searched and layers.grid_size == len(written)


def test_a_log_scale_needs_every_discrete_value_above_zero_wherever_it_is_listed():
    HyperparameterSpec.model_validate({"params": [with_(LAYERS, discreteValues=[4, 0.5], scaleType="UNIT_LOG_SCALE")]})
    with pytest.raises(ValueError, match="every discreteValue greater than 0"):
        HyperparameterSpec.model_validate(
            {"params": [with_(LAYERS, discreteValues=[4, 2, -1], scaleType="UNIT_LOG_SCALE")]})


@pytest.mark.parametrize("written", ["True", "TRUE", "true", "yes", True])
def test_booleans_as_configs_write_them(written):
    hp = HyperparameterSpec.model_validate({"enableTrialEarlyStopping": written, "params": [LR]})
    assert hp.early_stopping is True


def test_unset_fields_stay_unset_and_defaults_are_properties():
    hp = HyperparameterSpec.model_validate({"params": [LR]})
    assert hp.to_resource() == {"params": [{"parameterName": "learning_rate", "type": "DOUBLE",
                                            "minValue": 0.001, "maxValue": 0.1}]}
    assert (hp.effective_goal, hp.trials_limit, hp.parallel_limit, hp.failed_limit) == (Goal.MAXIMIZE, 1, 1, 0)
    assert (hp.metric_tag, hp.early_stopping, hp.search) == (
        "training/hptuning/metric", False, Algorithm.ALGORITHM_UNSPECIFIED)
    assert HyperparameterSpec.model_validate({"goal": "MINIMIZE", "params": [LR]}).effective_goal is Goal.MINIMIZE
    assert HyperparameterSpec.model_validate(
        {"goal": "GOAL_TYPE_UNSPECIFIED", "params": [LR]}).effective_goal is Goal.MAXIMIZE


def test_spec_survives_the_flag_merge_and_prints_as_given(tmp_path):
    path = tmp_path / "hptuning.yaml"
    path.write_text(REAL_WORLD)
    job = build_job(SubmitFlags(job_id="j", config=str(path), region="us-central1"))
    wire = job.to_resource()["trainingInput"]["hyperparameters"]
    assert wire["goal"] == "MAXIMIZE" and wire["maxTrials"] == "30" and wire["algorithm"] == "RANDOM_SEARCH"
    assert Job.model_validate_json(json.dumps(job.to_resource())) == job  # the store round-trip


TRAINING_OUTPUT = textwrap.dedent("""\
    {"completedTrialCount": "2",
     "isHyperparameterTuningJob": true,
     "hyperparameterMetricTag": "metric1",
     "consumedMLUnits": 1.23,
     "trials": [
       {"trialId": "37",
        "hyperparameters": {"hp_learning_rate": "0.0267", "hp_hidden_size": "512"},
        "finalMetric": {"trainingStep": "8000", "objectiveValue": 0.0276},
        "startTime": "2024-05-01T10:00:00Z", "endTime": "2024-05-01T10:05:00Z",
        "state": "SUCCEEDED", "isTrialStoppedEarly": false},
       {"trialId": "38", "hyperparameters": {"hp_learning_rate": "0.1", "hp_hidden_size": "64"},
        "allMetrics": [{"trainingStep": "100", "objectiveValue": 0.5}],
        "state": "FAILED", "isTrialStoppedEarly": true}
     ]}""")


def test_training_output_trials_round_trip_the_wire_format():
    job = Job.model_validate({"jobId": "hp", "trainingOutput": json.loads(TRAINING_OUTPUT)})
    trial = job.training_output.trials[0]
    assert trial.final_metric.training_step == 8000 and trial.hyperparameters["hp_hidden_size"] == "512"
    assert job.to_resource()["trainingOutput"] == json.loads(TRAINING_OUTPUT)


# A study resumed with resumePreviousJobId: what defines the study comes from the previous job
# where the new spec leaves it out (the service took a resumed spec without params); the budget
# is the new job's. (new spec, previous spec, what the resumed spec is)
PREVIOUS = {"goal": "MINIMIZE", "hyperparameterMetricTag": "loss", "algorithm": "GRID_SEARCH",
            "enableTrialEarlyStopping": True, "maxTrials": 4, "maxParallelTrials": 2, "maxFailedTrials": 1,
            "params": [UNITS, LAYERS]}
RESUMED = [
    ({"resumePreviousJobId": "first", "maxTrials": 10},
     PREVIOUS,
     {"goal": "MINIMIZE", "hyperparameterMetricTag": "loss", "algorithm": "GRID_SEARCH",
      "enableTrialEarlyStopping": True, "maxTrials": "10", "params": [UNITS, LAYERS], "resumePreviousJobId": "first"}),
    ({"resumePreviousJobId": "first", "params": []},
     {"params": [LR]},
     {"params": [LR], "resumePreviousJobId": "first"}),
    ({"resumePreviousJobId": "first", "goal": "MAXIMIZE", "params": [CELL], "enableTrialEarlyStopping": False},
     PREVIOUS,
     {"goal": "MAXIMIZE", "hyperparameterMetricTag": "loss", "algorithm": "GRID_SEARCH",
      "enableTrialEarlyStopping": False, "params": [CELL], "resumePreviousJobId": "first"}),
    ({"resumePreviousJobId": "second", "maxParallelTrials": 3},
     {**PREVIOUS, "resumePreviousJobId": "first"},  # a resumed job's own spec holds its params already
     {"goal": "MINIMIZE", "hyperparameterMetricTag": "loss", "algorithm": "GRID_SEARCH",
      "enableTrialEarlyStopping": True, "maxParallelTrials": "3", "params": [UNITS, LAYERS],
      "resumePreviousJobId": "second"}),
]


def wire(params: list[dict]) -> list[dict]:
    """Params as the resource prints them (numbers as doubles)."""
    return HyperparameterSpec.model_validate({"params": params}).to_resource()["params"]


@pytest.mark.parametrize("given, previous, resumed", RESUMED)
def test_a_resumed_spec_takes_the_study_it_leaves_out_from_the_previous_job(given, previous, resumed):
    spec = HyperparameterSpec.model_validate(given)  # no params: valid, since it names the study to resume
    taken = spec.resumed_from(HyperparameterSpec.model_validate(previous))
    assert taken.to_resource() == {**resumed, "params": wire(resumed["params"])}
    assert taken.parameters  # what the search needs


def test_a_resumed_spec_that_does_not_fit_the_previous_study_is_refused():
    spec = HyperparameterSpec.model_validate({"resumePreviousJobId": "first", "algorithm": "GRID_SEARCH"})
    with pytest.raises(ValueError, match="GRID_SEARCH takes INTEGER, CATEGORICAL or DISCRETE"):
        spec.resumed_from(HyperparameterSpec.model_validate({"params": [LR]}))


def test_without_resume_previous_job_id_params_are_still_required(tmp_path):
    with pytest.raises(ValidationError, match="at least one parameter is required: add a params list, or "
                       "resumePreviousJobId"):
        load_config(write_config(tmp_path, {"maxTrials": 3}))
    hp = load_config(write_config(tmp_path, {"maxTrials": 3, "resumePreviousJobId": "first"})).training_input
    assert hp.hyperparameters.params is None and hp.hyperparameters.resume_previous_job_id == "first"

"""A Vertex AI HyperparameterTuningJob's studySpec as the ml v1 study aiptrain runs
(aiptrain.vertex.study), and its trials as the service showed them: pure, no Docker.

Bodies are written as the SDK's REST transport sends them: enums as integers, int64 values as
strings (`$alt=json;enum-encoding=int`)."""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime, timezone

import pytest

from aiptrain.errors import ValidationError
from aiptrain.model import HyperparameterOutput, Metric, State
from aiptrain.planning import SearchCondition, Trial, contract_from_dict
from aiptrain.vertex.resources import HyperparameterTuningJob, StudySpec
from aiptrain.vertex.study import study_of, translate_tuning_job, trial_resources

TRIAL_JOB_SPEC = {
    "workerPoolSpecs": [{"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
                         "containerSpec": {"imageUri": "aiptrain/runtime:2.11", "command": ["python3", "-c", "pass"]}}],
    "baseOutputDirectory": {"outputUriPrefix": "gs://bucket/out"},
}
LR = {"parameterId": "lr", "doubleValueSpec": {"minValue": 0.0001, "maxValue": 0.1}, "scaleType": 2}
UNITS = {"parameterId": "units", "integerValueSpec": {"minValue": "4", "maxValue": "64"}, "scaleType": 1}
OPT = {"parameterId": "opt", "categoricalValueSpec": {"values": ["adam", "sgd"]}, "scaleType": 0}
BATCH = {"parameterId": "batch", "discreteValueSpec": {"values": [16.0, 32.0]}, "scaleType": 1}


def job(parameters=None, **study) -> dict:
    """A HyperparameterTuningJob body: the SDK's example study, with `study` fields replaced."""
    study_spec = {"metrics": [{"metricId": "accuracy", "goal": 1}],
                  "parameters": copy.deepcopy([LR, UNITS, OPT, BATCH] if parameters is None else parameters), **study}
    return {"displayName": "hp", "studySpec": study_spec, "maxTrialCount": 3, "parallelTrialCount": 2,
            "trialJobSpec": copy.deepcopy(TRIAL_JOB_SPEC)}


def parsed(body: dict) -> HyperparameterTuningJob:
    return HyperparameterTuningJob.model_validate(body)


def spec_and_rules(body: dict):
    return study_of(parsed(body))


def ml_params(body: dict) -> list[dict]:
    spec, _ = spec_and_rules(body)
    return [param.to_resource() for param in spec.parameters]


# -- what runs --------------------------------------------------------------------------------

@pytest.mark.parametrize("parameter, expected", [
    (LR, {"parameterName": "lr", "type": "DOUBLE", "minValue": 0.0001, "maxValue": 0.1,
          "scaleType": "UNIT_LOG_SCALE"}),
    (UNITS, {"parameterName": "units", "type": "INTEGER", "minValue": 4.0, "maxValue": 64.0,
             "scaleType": "UNIT_LINEAR_SCALE"}),
    (OPT, {"parameterName": "opt", "type": "CATEGORICAL", "categoricalValues": ["adam", "sgd"]}),
    (BATCH, {"parameterName": "batch", "type": "DISCRETE", "discreteValues": [16.0, 32.0],
             "scaleType": "UNIT_LINEAR_SCALE"}),
    ({"parameterId": "m", "doubleValueSpec": {"minValue": 0.1, "maxValue": 0.99}, "scaleType": "UNIT_REVERSE_LOG_SCALE"},
     {"parameterName": "m", "type": "DOUBLE", "minValue": 0.1, "maxValue": 0.99, "scaleType": "UNIT_REVERSE_LOG_SCALE"}),
    ({"parameterId": "n", "integerValueSpec": {"minValue": 1, "maxValue": 3}},  # gcloud's YAML: numbers, no scale
     {"parameterName": "n", "type": "INTEGER", "minValue": 1.0, "maxValue": 3.0}),
], ids=["double-log", "integer-linear", "categorical", "discrete", "reverse-log", "integer-unscaled"])
def test_each_parameter_type_and_scale(parameter, expected):
    assert ml_params(job([parameter])) == [expected]


@pytest.mark.parametrize("study, expected", [
    ({}, {"goal": "MAXIMIZE", "hyperparameterMetricTag": "accuracy", "algorithm": "ALGORITHM_UNSPECIFIED"}),
    ({"metrics": [{"metricId": "loss", "goal": 2}]}, {"goal": "MINIMIZE", "hyperparameterMetricTag": "loss"}),
    ({"metrics": [{"metricId": "loss", "goal": "MINIMIZE"}]}, {"goal": "MINIMIZE"}),
    ({"metrics": [{"metricId": "auc", "goal": 0}]}, {"goal": "MAXIMIZE"}),  # unspecified: maximize
    ({"algorithm": 3}, {"algorithm": "RANDOM_SEARCH"}),
    ({"algorithm": "RANDOM_SEARCH"}, {"algorithm": "RANDOM_SEARCH"}),
    ({"algorithm": 0}, {"algorithm": "ALGORITHM_UNSPECIFIED"}),
    ({"decayCurveStoppingSpec": {}}, {"enableTrialEarlyStopping": True}),
    ({"medianAutomatedStoppingSpec": {"useElapsedDuration": False}}, {"enableTrialEarlyStopping": True}),
    ({"observationNoise": 1}, {"algorithm": "ALGORITHM_UNSPECIFIED"}),
])
def test_metric_goal_algorithm_and_early_stopping(study, expected):
    spec, _ = spec_and_rules(job(**study))
    shown = spec.to_resource()
    assert {key: shown.get(key) for key in expected} == expected


def test_grid_search_of_integer_categorical_and_discrete():
    spec, _ = spec_and_rules(job([UNITS, OPT, BATCH], algorithm=2))
    assert spec.to_resource()["algorithm"] == "GRID_SEARCH"
    assert spec.grid_size == 61 * 2 * 2


def test_counts():
    body = {**job(), "maxTrialCount": 7, "parallelTrialCount": 3, "maxFailedTrialCount": 2}
    spec, _ = spec_and_rules(body)
    assert (spec.max_trials, spec.max_parallel_trials, spec.max_failed_trials) == (7, 3, 2)
    spec, _ = spec_and_rules({**body, "maxFailedTrialCount": 0})  # 0: the service decides
    assert spec.max_failed_trials is None


@pytest.mark.parametrize("selection, best", [(None, False), (0, False), (1, False), (2, True),
                                             ("BEST_MEASUREMENT", True)])
def test_measurement_selection(selection, best):
    _, rules = spec_and_rules(job(measurementSelectionType=selection) if selection is not None else job())
    assert rules.best_report_is_final is best


def conditional(parent: dict, *children: tuple[str, list, dict]) -> dict:
    """`parent` with conditional children: (condition field, parent values, child spec)."""
    specs = [{condition: {"values": values}, "parameterSpec": child} for condition, values, child in children]
    return {**parent, "conditionalParameterSpecs": specs}


MOMENTUM = {"parameterId": "momentum", "doubleValueSpec": {"minValue": 0.1, "maxValue": 0.9}, "scaleType": 1}
DEPTH = {"parameterId": "depth", "integerValueSpec": {"minValue": "1", "maxValue": "4"}, "scaleType": 1}
WIDTH = {"parameterId": "width", "discreteValueSpec": {"values": [8, 16]}}


@pytest.mark.parametrize("parameters, order, conditions", [
    ([conditional(OPT, ("parentCategoricalValues", ["sgd"], MOMENTUM))], ["opt", "momentum"],
     {"momentum": SearchCondition("opt", ("sgd",))}),
    # int64 values as the SDK sends them (strings), and as YAML writes them (numbers)
    ([conditional(DEPTH, ("parentIntValues", ["2", 3], WIDTH))], ["depth", "width"],
     {"width": SearchCondition("depth", ("2", "3"))}),
    ([conditional(BATCH, ("parentDiscreteValues", [32.0], MOMENTUM))], ["batch", "momentum"],
     {"momentum": SearchCondition("batch", ("32",))}),
    # nested: a conditional parameter is a parent in turn; the children come after their parent
    ([LR, conditional(OPT, ("parentCategoricalValues", ["sgd"], conditional(DEPTH, ("parentIntValues", ["4"], WIDTH))))],
     ["lr", "opt", "depth", "width"],
     {"depth": SearchCondition("opt", ("sgd",)), "width": SearchCondition("depth", ("4",))}),
    # the same child under disjoint values (study.proto allows it): one parameter, both conditions
    ([conditional(DEPTH, ("parentIntValues", ["1"], MOMENTUM), ("parentIntValues", ["3"], MOMENTUM))],
     ["depth", "momentum"], {"momentum": SearchCondition("depth", ("1", "3"))}),
], ids=["categorical-parent", "integer-parent", "discrete-parent", "nested", "merged"])
def test_conditional_parameters_are_flattened_with_their_conditions(parameters, order, conditions):
    spec, rules = spec_and_rules(job(parameters))
    assert [param.name for param in spec.parameters] == order
    assert rules.conditions == conditions


def test_translation_carries_the_study_in_the_job_and_its_rules_in_the_contract():
    body = job([conditional(OPT, ("parentCategoricalValues", ["sgd"], MOMENTUM))], measurementSelectionType=2)
    translation = translate_tuning_job("hp_tuning_job_123", "123", parsed(body))
    assert translation.job.job_id == "hp_tuning_job_123"
    assert translation.job.training_input.hyperparameters.hyperparameter_metric_tag == "accuracy"
    assert translation.job.training_input.master_config.image_uri == "aiptrain/runtime:2.11"
    study = translation.contract.study
    assert study.best_report_is_final and study.conditions == {"momentum": SearchCondition("opt", ("sgd",))}
    # a trial's output directories are under its own directory
    assert translation.contract.output_variables(Trial("2", {}))["AIP_MODEL_DIR"] == "gs://bucket/out/2/model/"
    # saved with the plan inputs and read back by the controller's study
    assert contract_from_dict(dataclasses.asdict(translation.contract)) == translation.contract


# -- what is refused ------------------------------------------------------------------------------

@pytest.mark.parametrize("body, message", [
    ({**job(), "studySpec": None}, "studySpec is required"),
    ({**job(), "trialJobSpec": None}, "trialJobSpec is required"),
    (job(metrics=[]), "studySpec.metrics is required"),
    (job(metrics=[{"metricId": "a", "goal": 1}, {"metricId": "b", "goal": 2}]),
     "studySpec.metrics holds 2 metrics; studies here optimise one (multi-objective studies are not run): keep one"),
    (job(metrics=[{"goal": 1}]), "studySpec.metrics[0].metricId is required"),
    (job(metrics=[{"metricId": "my metric", "goal": 1}]), "must not contain whitespace"),
    (job(metrics=[{"metricId": "a", "goal": 1, "safetyConfig": {"safetyThreshold": 0.1}}]), "safetyConfig is not run"),
    (job(convexAutomatedStoppingSpec={"maxStepCount": "10"}), "studySpec.convexAutomatedStoppingSpec is not run here"),
    (job(decayCurveStoppingSpec={}, medianAutomatedStoppingSpec={}), "takes one automated stopping spec"),
    (job(medianAutomatedStoppingSpec={"useElapsedDuration": True}),
     "studySpec.medianAutomatedStoppingSpec.useElapsedDuration is not supported"),
    (job(studyStoppingConfig={"maxNumTrials": 3}), "studySpec.studyStoppingConfig is not run here"),
    (job(parameters=[]), "studySpec.parameters is required"),
    ({**job(), "maxTrialCount": 0}, "maxTrialCount is required"),
    ({**job(), "parallelTrialCount": None}, "parallelTrialCount is required"),
    ({**job(), "maxTrialCount": 5000}, "maxTrialCount: is 5000; aiptrain runs at most 1000"),
    (job([{"parameterId": "x"}]), "studySpec.parameters[0] needs exactly one of doubleValueSpec, integerValueSpec"),
    (job([{**LR, **UNITS}]), "studySpec.parameters[0] needs exactly one of"),
    (job([{**LR, "doubleValueSpec": {"minValue": 1, "maxValue": 1}}]),
     "studySpec.parameters[0] (lr): minValue must be less than maxValue."),
    (job([{**LR, "doubleValueSpec": {"minValue": 0, "maxValue": 1}}]),
     "studySpec.parameters[0] (lr): UNIT_LOG_SCALE needs minValue greater than 0"),
    (job([{**OPT, "scaleType": 1}]), "studySpec.parameters[0] (opt): scaleType does not apply to CATEGORICAL"),
    (job([{**OPT, "categoricalValueSpec": {"values": []}}]),
     "studySpec.parameters[0] (opt): CATEGORICAL needs a non-empty categoricalValueSpec.values list."),
    (job([{**BATCH, "discreteValueSpec": {"values": [16, 16]}}]),
     "(batch): discreteValueSpec.values must not repeat a value"),
    (job([{**LR, "parameterId": "learning rate"}]), "parameterId must be a flag name"),
    (job([LR, {**UNITS, "parameterId": "lr"}]), "studySpec.parameters[1] (lr): parameterId is used twice"),
    (job([LR, UNITS], algorithm=2), "studySpec.parameters[0] (lr): GRID_SEARCH takes INTEGER, CATEGORICAL or DISCRETE"),
    (job([conditional(LR, ("parentDiscreteValues", [0.01], UNITS))]), "a DOUBLE parameter cannot be a parent"),
    (job([conditional(OPT, ("parentIntValues", ["1"], MOMENTUM))]),
     "studySpec.parameters[0].conditionalParameterSpecs[0] needs parentCategoricalValues (its parent [opt] is "
     "CATEGORICAL)"),
    (job([conditional(OPT, ("parentCategoricalValues", ["rmsprop"], MOMENTUM))]),
     "parentCategoricalValues.values: [rmsprop] is not a value of [opt]"),
    (job([conditional(DEPTH, ("parentIntValues", ["9"], MOMENTUM))]), "[9] is not a value of [depth]"),
    (job([conditional(BATCH, ("parentDiscreteValues", [20.0], MOMENTUM))]), "[20.0] is not a value of [batch]"),
    (job([conditional(OPT, ("parentCategoricalValues", [], MOMENTUM))]), "parentCategoricalValues.values is required"),
    (job([{**OPT, "conditionalParameterSpecs": [{"parentCategoricalValues": {"values": ["sgd"]}}]}]),
     "conditionalParameterSpecs[0].parameterSpec is required"),
    (job([conditional(DEPTH, ("parentIntValues", ["1", "2"], MOMENTUM), ("parentIntValues", ["2"], MOMENTUM))]),
     "[momentum] is conditional on [2] twice"),
    (job([conditional(DEPTH, ("parentIntValues", ["1"], MOMENTUM), ("parentIntValues", ["2"], {**MOMENTUM,
          "doubleValueSpec": {"minValue": 0.2, "maxValue": 0.3}}))]), "give this one its own parameterId"),
    (job([conditional(OPT, ("parentCategoricalValues", ["sgd"], {**MOMENTUM, "doubleValueSpec": {"minValue": 2,
          "maxValue": 1}}))]),
     "studySpec.parameters[0].conditionalParameterSpecs[0].parameterSpec (momentum): minValue must be less than"),
    (job([conditional(OPT, ("parentCategoricalValues", ["sgd"], {**LR}))], algorithm=3) | {"trialJobSpec": {}},
     "trialJobSpec.workerPoolSpecs[0] is required"),
], ids=lambda value: value[:40] if isinstance(value, str) else None)
def test_refusals_name_the_field_and_the_fix(body, message):
    with pytest.raises(ValidationError) as refused:
        translate_tuning_job("hp_tuning_job_1", "1", parsed(body))
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


# -- the trials, as the service showed them ----------------------------------------------------------

def test_trials_are_rendered_with_typed_values_states_and_final_measurements():
    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    study = StudySpec.model_validate(job([LR, UNITS, conditional(OPT, ("parentCategoricalValues", ["sgd"], MOMENTUM)),
                                          BATCH])["studySpec"])
    values = {"lr": "0.0123", "units": "47", "opt": "sgd", "momentum": "0.5", "batch": "32"}
    trials = [
        HyperparameterOutput(trial_id="1", hyperparameters=values, state=State.SUCCEEDED, start_time=moment,
                             end_time=moment, final_metric=Metric(training_step=2, objective_value=0.75)),
        HyperparameterOutput(trial_id="2", hyperparameters={**values, "opt": "adam"}, state=State.RUNNING,
                             start_time=moment),
        HyperparameterOutput(trial_id="3", hyperparameters=values, state=State.FAILED, start_time=moment,
                             end_time=moment),
        HyperparameterOutput(trial_id="4", hyperparameters=values, state=State.SUCCEEDED),  # no metric reported
        HyperparameterOutput(trial_id="5", hyperparameters=values, state=State.CANCELLED),
    ]
    shown = trial_resources(study, trials)
    assert shown[0] == {
        "id": "1", "state": "SUCCEEDED",
        "parameters": [{"parameterId": "lr", "value": 0.0123}, {"parameterId": "units", "value": 47},
                       {"parameterId": "opt", "value": "sgd"}, {"parameterId": "momentum", "value": 0.5},
                       {"parameterId": "batch", "value": 32}],
        "finalMeasurement": {"stepCount": "2", "metrics": [{"metricId": "accuracy", "value": 0.75}]},
        "startTime": "2026-01-02T03:04:05Z", "endTime": "2026-01-02T03:04:05Z",
    }
    assert [trial["state"] for trial in shown] == ["SUCCEEDED", "ACTIVE", "INFEASIBLE", "INFEASIBLE", "INFEASIBLE"]
    assert "finalMeasurement" not in shown[1] and "endTime" not in shown[1]

"""A Vertex AI HyperparameterTuningJob as the ml v1 tuning job the controller runs, and its
trials as the service showed them. Pure: no I/O.

The trialJobSpec is translated as a CustomJob's jobSpec is (aiptrain.vertex.translate); the
studySpec becomes a HyperparameterSpec (metrics[0] is the metric tag and goal, the four
parameter types, scales, algorithm, counts; both automated stopping specs run as the study's
median stopping rule), and what a HyperparameterSpec cannot say becomes the study's rules
(planning.StudyRules): conditional parameters, flattened after their parents, and
BEST_MEASUREMENT. The rules on parameter values are the ml v1 spec's own
(model.ParameterSpec.problem), told in Vertex's field names.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError as PydanticError
from pydantic.alias_generators import to_camel

from aiptrain import model
from aiptrain.config import pydantic_error_line
from aiptrain.errors import ValidationError
from aiptrain.model import HyperparameterOutput, ParameterType, State
from aiptrain.planning import CONDITION_TOLERANCE, SearchCondition, StudyRules
from aiptrain.vertex.resources import (
    Algorithm,
    ConditionalParameterSpec,
    GoalType,
    HyperparameterTuningJob,
    MeasurementSelectionType,
    MetricSpec,
    ParameterSpec,
    ScaleType,
    StudySpec,
    ValuesCondition,
)
from aiptrain.vertex.translate import Translation, translate

# The value spec of each parameter type, and the condition a child of such a parent names.
VALUE_SPECS = {"double_value_spec": ParameterType.DOUBLE, "integer_value_spec": ParameterType.INTEGER,
               "categorical_value_spec": ParameterType.CATEGORICAL, "discrete_value_spec": ParameterType.DISCRETE}
PARENT_CONDITIONS = {ParameterType.INTEGER: "parent_int_values", ParameterType.DISCRETE: "parent_discrete_values",
                     ParameterType.CATEGORICAL: "parent_categorical_values"}
# ml v1's names in the HyperparameterSpec rules' messages -> Vertex's (whole words).
VERTEX_WORDS = (("maxParallelTrials", "parallelTrialCount"), ("maxFailedTrials", "maxFailedTrialCount"),
                ("maxTrials", "maxTrialCount"), ("categoricalValues", "categoricalValueSpec.values"),
                ("discreteValues", "discreteValueSpec.values"), ("discreteValue", "discreteValueSpec value"),
                ("parameterName", "parameterId"), ("params", "studySpec.parameters"))
_ML_PARAM_PATH = re.compile(r"params\[(\d+)\]")
_WHITESPACE = re.compile(r"\s")


def translate_tuning_job(job_id: str, numeric_id: str, resource: HyperparameterTuningJob,
                         mapped_runtimes: dict[str, dict] | None = None) -> Translation:
    """The ml v1 tuning job `job_id` that runs `resource`, and its replicas' contract carrying the
    study's rules; ValidationError (one line naming the field) for what cannot run."""
    spec, rules = study_of(resource)
    if resource.trial_job_spec is None:
        raise ValidationError("trialJobSpec is required: the CustomJobSpec every trial runs (its workerPoolSpecs).")
    base = translate(job_id, numeric_id, resource.trial_job_spec, resource.labels, where="trialJobSpec",
                     mapped_runtimes=mapped_runtimes)
    base.job.training_input.hyperparameters = spec
    return Translation(base.job, dataclasses.replace(base.contract, study=rules), base.notices)


def study_of(resource: HyperparameterTuningJob) -> tuple[model.HyperparameterSpec, StudyRules]:
    """The HyperparameterSpec and the study rules of a tuning job's studySpec and counts."""
    study = resource.study_spec
    if study is None:
        raise ValidationError("studySpec is required: the metric to optimise and the parameters to tune.")
    _refuse_what_is_not_run(study)
    metric = _metric(study.metrics)
    flat = _Flattened()
    if not study.parameters:
        raise ValidationError("studySpec.parameters is required: the parameters to tune, e.g. "
                              "[{parameterId: lr, doubleValueSpec: {minValue: 0.001, maxValue: 0.1}}].")
    for index, parameter in enumerate(study.parameters):
        flat.add(parameter, f"studySpec.parameters[{index}]")
    for count in ("max_trial_count", "parallel_trial_count"):
        if not getattr(resource, count):
            raise ValidationError(f"{to_camel(count)} is required: a number of trials, at least 1.")
    fields = {
        "goal": "MINIMIZE" if metric.goal is GoalType.MINIMIZE else "MAXIMIZE",  # unspecified: maximize
        "hyperparameter_metric_tag": metric.metric_id,
        "params": flat.specs,
        "max_trials": resource.max_trial_count,
        "max_parallel_trials": resource.parallel_trial_count,
        "max_failed_trials": resource.max_failed_trial_count or None,
        "algorithm": (study.algorithm or Algorithm.ALGORITHM_UNSPECIFIED).name,
        "enable_trial_early_stopping": study.stops_early or None,
    }
    try:
        spec = model.HyperparameterSpec.model_validate(fields)
    except PydanticError as exc:
        raise ValidationError(_vertex_line(exc, flat)) from None
    best = study.measurement_selection_type is MeasurementSelectionType.BEST_MEASUREMENT
    return spec, StudyRules(conditions=flat.conditions, best_report_is_final=best)


def _refuse_what_is_not_run(study: StudySpec) -> None:
    if study.convex_automated_stopping_spec is not None:
        raise ValidationError("studySpec.convexAutomatedStoppingSpec is not run here: use "
                              "medianAutomatedStoppingSpec or decayCurveStoppingSpec, which stop a trial whose "
                              "metric trails the other trials' median at the same step.")
    if study.decay_curve_stopping_spec is not None and study.median_automated_stopping_spec is not None:
        raise ValidationError("studySpec takes one automated stopping spec: give decayCurveStoppingSpec or "
                              "medianAutomatedStoppingSpec, not both.")
    for name, stopping in (("decayCurveStoppingSpec", study.decay_curve_stopping_spec),
                           ("medianAutomatedStoppingSpec", study.median_automated_stopping_spec)):
        if stopping and stopping.get("useElapsedDuration", stopping.get("use_elapsed_duration")):
            raise ValidationError(f"studySpec.{name}.useElapsedDuration is not supported: trials are compared at "
                                  "the same step of their reports here; leave it false.")
    if study.study_stopping_config is not None:
        raise ValidationError("studySpec.studyStoppingConfig is not run here: a study ends after maxTrialCount "
                              "trials (or once maxFailedTrialCount failed); remove it.")


def _metric(metrics: list[MetricSpec] | None) -> MetricSpec:
    if not metrics:
        raise ValidationError("studySpec.metrics is required: the metric the trials report, e.g. "
                              "[{metricId: accuracy, goal: MAXIMIZE}].")
    if len(metrics) > 1:
        raise ValidationError(f"studySpec.metrics holds {len(metrics)} metrics; studies here optimise one "
                              "(multi-objective studies are not run): keep one metric.")
    metric = metrics[0]
    if not metric.metric_id:
        raise ValidationError("studySpec.metrics[0].metricId is required: the tag the trials report, as "
                              "cloudml-hypertune's hyperparameter_metric_tag.")
    if _WHITESPACE.search(metric.metric_id):
        raise ValidationError(f"studySpec.metrics[0].metricId [{metric.metric_id}] must not contain whitespace.")
    if metric.safety_config is not None:
        raise ValidationError("studySpec.metrics[0].safetyConfig is not run here (safe search): remove it.")
    return metric


@dataclass
class _Flattened:
    """The parameters of a studySpec's tree, each parent before its conditional children: the
    ml v1 specs, where each came from, and when each conditional one is searched."""

    specs: list[model.ParameterSpec] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    conditions: dict[str, SearchCondition] = field(default_factory=dict)

    def add(self, parameter: ParameterSpec, path: str, condition: SearchCondition | None = None) -> None:
        spec = ml_parameter(parameter, path)
        problem = spec.problem()
        if problem:
            raise ValidationError(f"{path} ({parameter.parameter_id or 'no parameterId'}): {_vertex_words(problem)}.")
        self.specs.append(spec)
        self.paths.append(path)
        if condition is not None:
            self.conditions[spec.name] = condition
        for child, child_path, values in _children(parameter, spec, path):
            self.add(child, child_path, SearchCondition(spec.name, tuple(values)))


def _children(parameter: ParameterSpec, spec: model.ParameterSpec,
              path: str) -> list[tuple[ParameterSpec, str, list[str]]]:
    """A parameter's conditional children with the parent values each is searched under; a
    child named twice (for disjoint parent values, as study.proto allows) is searched once,
    under the union of its conditions."""
    children = parameter.conditional_parameter_specs or []
    if children and spec.type is ParameterType.DOUBLE:
        raise ValidationError(f"{path}.conditionalParameterSpecs: a DOUBLE parameter cannot be a parent; "
                              "conditions name the values of a DISCRETE, INTEGER or CATEGORICAL one.")
    merged: dict[str, tuple[ParameterSpec, str, list[str]]] = {}
    for index, child in enumerate(children):
        child_path = f"{path}.conditionalParameterSpecs[{index}]"
        if child.parameter_spec is None:
            raise ValidationError(f"{child_path}.parameterSpec is required: the conditional parameter.")
        values = _condition_values(child, spec, child_path)
        name = child.parameter_spec.parameter_id or ""
        if name not in merged:
            merged[name] = (child.parameter_spec, f"{child_path}.parameterSpec", values)
            continue
        first, _, taken = merged[name]
        if child.parameter_spec != first:
            raise ValidationError(f"{child_path}.parameterSpec: [{name}] is also conditional on other values with "
                                  "another spec; a parameter has one spec here: give this one its own parameterId.")
        overlap = sorted(set(taken) & set(values))
        if overlap:
            raise ValidationError(f"{child_path}: [{name}] is conditional on [{', '.join(overlap)}] twice: the "
                                  "conditions of one parameter must name disjoint parent values.")
        taken.extend(values)
    return list(merged.values())


def ml_parameter(parameter: ParameterSpec, path: str) -> model.ParameterSpec:
    """One studySpec parameter (its own value spec, without its children) as an ml v1 parameter."""
    given = [name for name in VALUE_SPECS if getattr(parameter, name) is not None]
    if len(given) != 1:
        raise ValidationError(f"{path} needs exactly one of doubleValueSpec, integerValueSpec, "
                              "categoricalValueSpec and discreteValueSpec.")
    kind = VALUE_SPECS[given[0]]
    value_spec = getattr(parameter, given[0])
    scale = parameter.scale_type
    fields: dict[str, Any] = {"parameter_name": parameter.parameter_id, "type": kind.value,
                              "scale_type": scale.name if scale and scale is not ScaleType.SCALE_TYPE_UNSPECIFIED
                              else None}
    if kind in (ParameterType.DOUBLE, ParameterType.INTEGER):
        fields.update(min_value=value_spec.min_value, max_value=value_spec.max_value)
    elif kind is ParameterType.CATEGORICAL:
        fields["categorical_values"] = value_spec.values
    else:
        fields["discrete_values"] = value_spec.values
    return model.ParameterSpec.model_validate(fields)


def _condition_values(child: ConditionalParameterSpec, parent: model.ParameterSpec, path: str) -> list[str]:
    """The parent's values under which a child is searched, as a trial receives them; refused
    unless they are the parent's own values, under the condition of the parent's type."""
    kind = parent.type
    assert kind is not None and kind in PARENT_CONDITIONS  # a checked parent, not a DOUBLE one
    expected = PARENT_CONDITIONS[kind]
    given = [name for name in PARENT_CONDITIONS.values() if getattr(child, name) is not None]
    if given != [expected]:
        raise ValidationError(f"{path} needs {to_camel(expected)} (its parent [{parent.name}] is "
                              f"{kind.value}), and no other parent condition.")
    condition: ValuesCondition = getattr(child, expected)
    if not condition.values:
        raise ValidationError(f"{path}.{to_camel(expected)}.values is required: the values of [{parent.name}] "
                              "under which the conditional parameter is searched.")
    texts = []
    for value in condition.values:
        text = _parent_value(value, parent)
        if text is None:
            raise ValidationError(f"{path}.{to_camel(expected)}.values: [{value}] is not a value of [{parent.name}]: "
                                  f"use values its {kind.value} spec holds.")
        texts.append(text)
    return texts


def _parent_value(value: Any, parent: model.ParameterSpec) -> str | None:
    """A condition's value as the trial receives it, when the parent can take it."""
    if parent.type is ParameterType.CATEGORICAL:
        return value if isinstance(value, str) and value in parent.choices else None
    number = _number(value)
    if number is None:
        return None
    if parent.type is ParameterType.INTEGER:
        low, high = parent.bounds
        return str(int(number)) if number.is_integer() and low <= number <= high else None
    held = [choice for choice in parent.choices
            if math.isclose(float(choice), number, rel_tol=0, abs_tol=CONDITION_TOLERANCE)]
    return _number_text(float(held[0])) if held else None


def _number(value: Any) -> float | None:
    """A JSON number, or an int64 as the REST transports write it (a string)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _number_text(value: float) -> str:
    """A number as a trial receives it: `4` for a whole one, `0.5` otherwise."""
    return str(int(value)) if value.is_integer() else repr(value)


def _vertex_words(text: str) -> str:
    for ours, theirs in VERTEX_WORDS:
        text = re.sub(rf"\b{ours}\b", theirs, text)
    return text


def _vertex_line(error: PydanticError, flat: _Flattened) -> str:
    """The HyperparameterSpec rules' refusal with the field as the studySpec names it."""
    line = pydantic_error_line(error, "studySpec").removeprefix("studySpec: ")
    found = _ML_PARAM_PATH.match(line)
    if found:
        line = flat.paths[int(found[1])] + line[found.end():]
    return _vertex_words(line)


# -- the trials, as the service showed them ----------------------------------------------------

def parameter_types(parameters: list[ParameterSpec] | None) -> dict[str, ParameterType]:
    """Every parameter of a studySpec's tree by its parameterId."""
    found: dict[str, ParameterType] = {}
    for parameter in parameters or ():
        kind = next((VALUE_SPECS[name] for name in VALUE_SPECS if getattr(parameter, name) is not None), None)
        if parameter.parameter_id and kind:
            found[parameter.parameter_id] = kind
        children = [child.parameter_spec for child in parameter.conditional_parameter_specs or ()
                    if child.parameter_spec]
        found.update(parameter_types(children))
    return found


def trial_resources(study: StudySpec, trials: list[HyperparameterOutput]) -> list[dict[str, Any]]:
    """The ml v1 job's trials as the HyperparameterTuningJob's `trials`: ACTIVE while running,
    SUCCEEDED with a final measurement, INFEASIBLE otherwise (failed, cancelled, or done without
    a metric), parameters typed as the studySpec declares them."""
    types = parameter_types(study.parameters)
    metric_id = study.metrics[0].metric_id if study.metrics else ""
    return [_trial(trial, types, metric_id or "") for trial in trials]


def _trial(trial: HyperparameterOutput, types: dict[str, ParameterType], metric_id: str) -> dict[str, Any]:
    resource: dict[str, Any] = {"id": trial.trial_id, "state": _trial_state(trial)}
    resource["parameters"] = [{"parameterId": name, "value": _typed(text, types.get(name))}
                              for name, text in trial.hyperparameters.items()]
    metric = trial.final_metric
    if metric is not None and metric.objective_value is not None:
        measurement: dict[str, Any] = {}
        if metric.training_step:
            measurement["stepCount"] = str(metric.training_step)
        measurement["metrics"] = [{"metricId": metric_id, "value": metric.objective_value}]
        resource["finalMeasurement"] = measurement
    if trial.start_time:
        resource["startTime"] = model.rfc3339(trial.start_time)
    if trial.end_time:
        resource["endTime"] = model.rfc3339(trial.end_time)
    return resource


def _trial_state(trial: HyperparameterOutput) -> str:
    if trial.state is None or not trial.state.is_terminal:
        return "ACTIVE"
    measured = trial.final_metric is not None and trial.final_metric.objective_value is not None
    return "SUCCEEDED" if trial.state is State.SUCCEEDED and measured else "INFEASIBLE"


def _typed(text: str, kind: ParameterType | None) -> Any:
    """A trial's value as a JSON number for the numeric types, a string for CATEGORICAL."""
    if kind in (None, ParameterType.CATEGORICAL):
        return text
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() else number

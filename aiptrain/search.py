"""The search of a hyperparameter tuning study: which values the next trial gets, and whether
a running trial should stop early. A thin layer over optuna's ask-and-tell interface.

The study loop owns the trials (containers, metric files, the store); this module only sees
their values and objectives. Samplers: TPE for ALGORITHM_UNSPECIFIED (Bayesian optimisation),
a grid for GRID_SEARCH, random for RANDOM_SEARCH, all seeded so a spec and a seed give the same
sequence. Storage is in memory: after a controller restart the study rebuilds the Search from
the stored trials with restore().

Values are drawn define-by-run, parameter by parameter in the spec's order, so a conditional
parameter (planning.StudyRules: searched only when its parent took one of some values) is
drawn only in the trials where its condition holds, and TPE models it from those trials.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Iterable
from typing import Any, Literal, TypeVar

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from aiptrain.model import (
    Algorithm,
    Goal,
    HyperparameterOutput,
    HyperparameterSpec,
    ParameterSpec,
    ParameterType,
    ScaleType,
    State,
)
from aiptrain.planning import CONDITION_TOLERANCE, StudyRules

optuna.logging.set_verbosity(optuna.logging.ERROR)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

# Median stopping rule: a trial stops when its best report so far is worse than the median of
# the finished trials' reports at the same step, once this many trials have finished.
EARLY_STOPPING_STARTUP_TRIALS = 2

_TRIAL_ID = "trial_id"  # user attribute: the service's trial id of an optuna trial
_HISTORY = "history"  # user attribute: a trial of the previous job (resumePreviousJobId)
_Number = TypeVar("_Number", int, float)
_RANGE_TYPES = (ParameterType.DOUBLE, ParameterType.INTEGER)  # the others list their values


class _Param:
    """One ParameterSpec as an optuna distribution, and the conversions between the value the
    trial sees on its command line (a string) and the value optuna samples."""

    def __init__(self, spec: ParameterSpec, on_grid: bool):
        self.name = spec.name
        self.type = spec.type
        self.distribution = self._distribution(spec)
        self.discrete_values = spec.discrete_values or []  # empty unless DISCRETE
        self.grid_values = spec.grid_values if on_grid else []
        # UNIT_REVERSE_LOG_SCALE is dense near maxValue: optuna samples y on a log scale and the
        # trial gets low + high - y, `mirror` being low + high. A grid takes every point, so it
        # needs no scale; CATEGORICAL and DISCRETE lists are sampled as choices, so it cannot apply.
        self.mirror: float | None = None
        if spec.scale is ScaleType.UNIT_REVERSE_LOG_SCALE and not on_grid and self.type in _RANGE_TYPES:
            low, high = spec.bounds
            self.mirror = low + high

    def _distribution(self, spec: ParameterSpec) -> BaseDistribution:
        if self.type not in _RANGE_TYPES:
            return CategoricalDistribution(spec.choices)
        low, high = spec.bounds
        if self.type is ParameterType.INTEGER:
            return IntDistribution(int(low), int(high), log=spec.scale.is_log)
        return FloatDistribution(low, high, log=spec.scale.is_log)

    def draw(self, trial: optuna.Trial) -> Any:
        """The sampled value of this parameter in a trial being asked (or the value its
        enqueued grid point fixes)."""
        distribution = self.distribution
        if isinstance(distribution, FloatDistribution):
            return trial.suggest_float(self.name, distribution.low, distribution.high, log=distribution.log)
        if isinstance(distribution, IntDistribution):
            return trial.suggest_int(self.name, distribution.low, distribution.high, log=distribution.log)
        assert isinstance(distribution, CategoricalDistribution)
        return trial.suggest_categorical(self.name, distribution.choices)

    def is_one_of(self, sampled: Any, texts: tuple[str, ...]) -> bool:
        """Whether the value a trial receives is one of `texts` (a condition's values)."""
        text = self.to_text(sampled)
        if self.type is ParameterType.CATEGORICAL:
            return text in texts
        return any(math.isclose(float(text), float(value), rel_tol=0, abs_tol=CONDITION_TOLERANCE)
                   for value in texts)

    def to_text(self, sampled: Any) -> str:
        """The value as the service passes it: `12`, `0.0123`, `4` (integral DISCRETE), `gru`."""
        if self.type is ParameterType.CATEGORICAL:
            return sampled
        value = self.mirror - sampled if self.mirror is not None else sampled
        if self.type is ParameterType.INTEGER:
            return str(int(value))
        value = float(value)
        if self.type is ParameterType.DISCRETE and value.is_integer():
            return str(int(value))
        return repr(value)

    def from_text(self, text: str) -> Any:
        """The sampled value behind a trial's string; ValueError when it is not in this space."""
        sampled: Any = None
        if self.type is ParameterType.CATEGORICAL:
            sampled = text
        elif self.type is ParameterType.DISCRETE:
            sampled = next((v for v in self.discrete_values if math.isclose(v, float(text))), None)
        elif self.type is ParameterType.INTEGER:
            sampled = self._unreverse(int(float(text)))
        elif isinstance(self.distribution, FloatDistribution):  # DOUBLE
            # low + high - x can land a rounding error outside [low, high]
            sampled = min(max(self._unreverse(float(text)), self.distribution.low), self.distribution.high)
        if sampled is None or not self.distribution._contains(self.distribution.to_internal_repr(sampled)):
            raise ValueError(f"{self.name}={text} is outside the search space")
        return sampled

    def _unreverse(self, value: _Number) -> _Number:
        return type(value)(self.mirror - value) if self.mirror is not None else value


class _Grid:
    """GRID_SEARCH: every point of the search space once, in an order shuffled by the seed. A
    point is held by any trial with its values, whatever its state (a failed point is not
    retried), the restored trials and a previous job's included, so a study rebuilt from its
    trials continues where it was. A conditional parameter is in the points where its
    condition holds only."""

    def __init__(self, points: list[dict[str, Any]], seed: int):
        random.Random(seed).shuffle(points)
        self.points = points
        self._keys = [_point_key(point) for point in points]

    @property
    def size(self) -> int:
        return len(self.points)

    def free_points(self, study: optuna.Study) -> list[dict[str, Any]]:
        held = {_point_key(trial.params) for trial in study.get_trials(deepcopy=False)}
        return [point for point, key in zip(self.points, self._keys, strict=True) if key not in held]


def _point_key(values: dict[str, Any]) -> frozenset:
    return frozenset(values.items())


class Search:
    """The search of one HP job. Trials are named by the service's trial ids ("1", "2", ...)."""

    def __init__(self, spec: HyperparameterSpec, seed: int = 0, rules: StudyRules | None = None):
        self.spec = spec
        on_grid = spec.search is Algorithm.GRID_SEARCH
        self._params = [_Param(param, on_grid) for param in spec.parameters]
        self._by_name = {param.name: param for param in self._params}
        self._conditions = rules.conditions if rules else {}
        self._grid = None
        if on_grid:  # a grid point is enqueued before each ask: the sampler draws nothing
            self._grid = _Grid(self._grid_points(), seed)
            sampler: optuna.samplers.BaseSampler = optuna.samplers.RandomSampler(seed=seed)
        elif spec.search is Algorithm.RANDOM_SEARCH:
            sampler = optuna.samplers.RandomSampler(seed=seed)
        else:  # constant_liar: running trials count as bad, so parallel trials spread out
            sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True)
        pruner = (
            optuna.pruners.MedianPruner(n_startup_trials=EARLY_STOPPING_STARTUP_TRIALS)
            if spec.early_stopping else optuna.pruners.NopPruner()
        )
        direction: Literal["minimize", "maximize"] = "minimize" if spec.effective_goal is Goal.MINIMIZE else "maximize"
        self._study = optuna.create_study(sampler=sampler, pruner=pruner, direction=direction)
        self._trials: dict[str, optuna.Trial] = {}  # this job's trials, by trial id
        self._steps: dict[str, set[int]] = {}  # the steps each trial reported

    @property
    def trial_budget(self) -> int:
        """How many trials the study runs: maxTrials, and no more than the grid has points."""
        if self._grid is not None:
            return min(self.spec.trials_limit, self._grid.size)
        return self.spec.trials_limit

    def _searched(self, param: _Param, sampled: dict[str, Any]) -> bool:
        """Whether a trial holding the values `sampled` so far draws `param`: always, unless it
        is conditional and its parent was not drawn or took none of the condition's values."""
        condition = self._conditions.get(param.name)
        if condition is None:
            return True
        return condition.parent in sampled and self._by_name[condition.parent].is_one_of(
            sampled[condition.parent], condition.values)

    def _grid_points(self) -> list[dict[str, Any]]:
        """Every combination of the parameters' grid values, a conditional parameter's only
        under the values of its parent that its condition names."""
        points: list[dict[str, Any]] = [{}]
        for param in self._params:
            grown: list[dict[str, Any]] = []
            for point in points:
                if self._searched(param, point):
                    grown.extend({**point, param.name: value} for value in param.grid_values)
                else:
                    grown.append(point)
            points = grown
        return points

    def add_history(self, trials: Iterable[HyperparameterOutput]) -> None:
        """Inform the sampler of a previous job's finished trials (resumePreviousJobId). Trials
        whose values do not fit this spec, and unfinished ones, are left out."""
        for output in trials:
            if output.state is None or not output.state.is_terminal:
                continue
            try:
                self._add(output, {_HISTORY: True})
            except ValueError:
                continue

    def restore(self, trials: Iterable[HyperparameterOutput]) -> None:
        """Rebuild this job's trials after a controller restart: finished ones, and running ones
        that complete() can end later. Values outside the spec raise ValueError."""
        for output in trials:
            if output.trial_id in self._trials:
                raise ValueError(f"trial {output.trial_id} is restored twice")
            trial = self._add(output, {_TRIAL_ID: output.trial_id})
            self._trials[output.trial_id] = optuna.Trial(self._study, trial._trial_id)
            self._steps[output.trial_id] = set()

    def _add(self, output: HyperparameterOutput, user_attrs: dict[str, Any]) -> FrozenTrial:
        values: dict[str, Any] = {}
        for param in self._params:
            if not self._searched(param, values):
                continue  # a value the trial holds for it anyway is not part of its point
            if param.name not in output.hyperparameters:
                raise ValueError(f"trial {output.trial_id} lacks a value for {param.name}")
            values[param.name] = param.from_text(output.hyperparameters[param.name])
        state, value = _optuna_outcome(output)
        self._study.add_trial(create_trial(
            state=state,
            value=value if state is TrialState.COMPLETE else None,
            intermediate_values=_reports(output) if state is not TrialState.RUNNING else None,
            params=values,
            distributions={name: self._by_name[name].distribution for name in values},
            user_attrs=user_attrs,
        ))
        return self._study.get_trials(deepcopy=False)[-1]

    def suggest(self, trial_id: str) -> dict[str, str] | None:
        """Values for a new trial as `{parameterName: value}` strings; None when the grid has no
        point left that a trial has not taken."""
        if trial_id in self._trials:
            raise ValueError(f"trial {trial_id} already exists")
        if self._grid is not None:
            free = self._grid.free_points(self._study)
            if not free:
                return None  # every point is held by a trial, the previous job's included
            self._study.enqueue_trial(free[0])
        trial = self._study.ask()
        sampled: dict[str, Any] = {}
        for param in self._params:
            if self._searched(param, sampled):
                sampled[param.name] = param.draw(trial)
        trial.set_user_attr(_TRIAL_ID, trial_id)
        self._trials[trial_id] = trial
        self._steps[trial_id] = set()
        return {name: self._by_name[name].to_text(value) for name, value in sampled.items()}

    def report(self, trial_id: str, step: int, value: float) -> bool:
        """Record an intermediate objective; True when the trial should stop early (only with
        enableTrialEarlyStopping). A step reported again is ignored."""
        trial = self._trials[trial_id]
        if step in self._steps[trial_id] or not math.isfinite(value):
            return False
        self._steps[trial_id].add(step)
        trial.report(value, step)
        return self.spec.early_stopping and trial.should_prune()

    def complete(self, trial_id: str, value: float | None, state: State, stopped_early: bool = False) -> None:
        """End a trial: SUCCEEDED with a value counts; no value, FAILED or CANCELLED is a failure;
        a trial stopped early counts as pruned with its last value."""
        trial = self._trials[trial_id]
        if stopped_early:
            if value is not None and not self._steps[trial_id] and math.isfinite(value):
                trial.report(value, 0)
            self._study.tell(trial, state=TrialState.PRUNED)
        elif state is State.SUCCEEDED and value is not None and math.isfinite(value):
            self._study.tell(trial, value)
        else:
            self._study.tell(trial, state=TrialState.FAIL)

    def best_trial_id(self) -> str | None:
        """The finished trial of this job with the best objective; None before one succeeded."""
        complete = self._study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        done = {t.user_attrs[_TRIAL_ID]: t.value for t in complete if _TRIAL_ID in t.user_attrs and t.value is not None}
        if not done:
            return None
        pick = min if self.spec.effective_goal is Goal.MINIMIZE else max
        return pick(done, key=done.__getitem__)


def _optuna_outcome(output: HyperparameterOutput) -> tuple[TrialState, float | None]:
    """The optuna state and value of a stored trial."""
    value = output.final_metric.objective_value if output.final_metric else None
    if value is not None and not math.isfinite(value):
        value = None
    if output.state is None or not output.state.is_terminal:
        return TrialState.RUNNING, None
    if output.is_trial_stopped_early:
        return TrialState.PRUNED, value
    if output.state is State.SUCCEEDED and value is not None:
        return TrialState.COMPLETE, value
    return TrialState.FAIL, None


def _reports(output: HyperparameterOutput) -> dict[int, float]:
    """A stored trial's objective by step, for the pruner: allMetrics where the loop kept them,
    and the final metric."""
    metrics = [*(output.all_metrics or ()), *([output.final_metric] if output.final_metric else ())]
    return {m.training_step or 0: m.objective_value for m in metrics
            if m.objective_value is not None and math.isfinite(m.objective_value)}

"""The search of a hyperparameter tuning study: which values the next trial gets, and whether
a running trial should stop early. A thin layer over optuna's ask-and-tell interface.

The study loop owns the trials (containers, metric files, the store); this module only sees
their values and objectives. Samplers: TPE for ALGORITHM_UNSPECIFIED (Bayesian optimisation),
a grid for GRID_SEARCH, random for RANDOM_SEARCH, all seeded so a spec and a seed give the same
sequence. Storage is in memory: after a controller restart the study rebuilds the Search from
the stored trials with restore().
"""

from __future__ import annotations

import math
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


class _ResumableGridSampler(optuna.samplers.GridSampler):
    """optuna's GridSampler for an ask-and-tell study that can be rebuilt from its trials.

    optuna gives trial number n grid point n while n is below the grid size, which repeats a
    point once restored trials hold numbers too; here a new trial always takes the first point
    (in the sampler's seeded shuffled order) that no trial holds. And optuna calls study.stop()
    after the last point, which raises outside optimize(); the Search knows when the grid is
    done without it.
    """

    def grid_attrs(self, values: dict[str, Any]) -> dict[str, Any]:
        """The system attributes that mark a trial with these values as holding its grid point."""
        point = tuple(values[name] for name in self._param_names)
        return {"search_space": self._search_space, "grid_id": self._all_grids.index(point)}

    @property
    def size(self) -> int:
        return len(self._all_grids)

    def free_points(self, study: optuna.Study) -> list[int]:
        """Grid ids no trial holds, whatever its state (a failed point is not retried)."""
        held = {t.system_attrs.get("grid_id") for t in study.get_trials(deepcopy=False)}
        return [grid_id for grid_id in range(self.size) if grid_id not in held]

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if "grid_id" in trial.system_attrs:
            return
        grid_id = self.free_points(study)[0]  # Search.suggest asks only while one is free
        study._storage.set_trial_system_attr(trial._trial_id, "search_space", self._search_space)
        study._storage.set_trial_system_attr(trial._trial_id, "grid_id", grid_id)

    def after_trial(self, study, trial, state, values) -> None:
        pass


class Search:
    """The search of one HP job. Trials are named by the service's trial ids ("1", "2", ...)."""

    def __init__(self, spec: HyperparameterSpec, seed: int = 0):
        self.spec = spec
        on_grid = spec.search is Algorithm.GRID_SEARCH
        self._params = [_Param(param, on_grid) for param in spec.parameters]
        self._distributions = {param.name: param.distribution for param in self._params}
        self._grid = None
        if on_grid:
            self._grid = _ResumableGridSampler({p.name: p.grid_values for p in spec.parameters}, seed=seed)
            sampler: optuna.samplers.BaseSampler = self._grid
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
        values = {param.name: param.from_text(output.hyperparameters[param.name]) for param in self._params
                  if param.name in output.hyperparameters}
        if len(values) != len(self._params):
            raise ValueError(f"trial {output.trial_id} lacks values for some parameters")
        state, value = _optuna_outcome(output)
        self._study.add_trial(create_trial(
            state=state,
            value=value if state is TrialState.COMPLETE else None,
            intermediate_values=_reports(output) if state is not TrialState.RUNNING else None,
            params=values,
            distributions=self._distributions,
            user_attrs=user_attrs,
            system_attrs=self._grid.grid_attrs(values) if self._grid is not None else None,
        ))
        return self._study.get_trials(deepcopy=False)[-1]

    def suggest(self, trial_id: str) -> dict[str, str] | None:
        """Values for a new trial as `{parameterName: value}` strings; None when the grid has no
        point left that a trial has not taken."""
        if trial_id in self._trials:
            raise ValueError(f"trial {trial_id} already exists")
        if self._grid is not None and not self._grid.free_points(self._study):
            return None  # every point is held by a trial, the previous job's included
        trial = self._study.ask(fixed_distributions=self._distributions)
        trial.set_user_attr(_TRIAL_ID, trial_id)
        self._trials[trial_id] = trial
        self._steps[trial_id] = set()
        return {param.name: param.to_text(trial.params[param.name]) for param in self._params}

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

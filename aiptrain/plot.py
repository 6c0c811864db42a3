"""`jobs plot`: a picture of a hyperparameter tuning study.

One figure: the objective of each trial with the best so far, then one panel per parameter
(its value against the objective; categorical values as categories). matplotlib is the optional
extra `aiptrain[plot]`, imported only here and only when a plot is drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from aiptrain.errors import EnvironmentNotReady, ValidationError
from aiptrain.model import (
    Goal,
    HyperparameterOutput,
    HyperparameterSpec,
    Job,
    ParameterSpec,
    ParameterType,
    ScaleType,
    trial_order,
)

PANEL_INCHES = (5.0, 3.6)
COLUMNS = 3


@dataclass(frozen=True)
class TrialPoint:
    number: int  # the trial's position on the x axis (its id when numeric)
    trial_id: str
    objective: float | None  # None: failed, or no objective reported
    stopped_early: bool
    values: dict[str, str]


def _tuning_spec(job: Job) -> HyperparameterSpec:
    spec = job.training_input.hyperparameters
    if spec is None:
        raise ValidationError(
            f"Job [{job.job_id}] is not a hyperparameter tuning job: `jobs plot` draws the trials of a job "
            "submitted with trainingInput.hyperparameters."
        )
    return spec


def trial_points(job: Job) -> list[TrialPoint]:
    """The job's trials in trial-id order; ValidationError when there is nothing to plot."""
    _tuning_spec(job)
    trials = (job.training_output and job.training_output.trials) or []
    trials = sorted(trials, key=lambda trial: trial_order(trial.trial_id))
    points = [_point(position, trial) for position, trial in enumerate(trials, start=1)]
    if not any(point.objective is not None for point in points):
        raise ValidationError(
            f"Job [{job.job_id}] has no trial with an objective value yet: plot it once a trial has finished."
        )
    return points


def _point(position: int, trial: HyperparameterOutput) -> TrialPoint:
    objective = trial.final_metric.objective_value if trial.final_metric else None
    if objective is not None and not math.isfinite(objective):
        objective = None
    return TrialPoint(
        number=int(trial.trial_id) if trial.trial_id.isdigit() else position,
        trial_id=trial.trial_id,
        objective=objective,
        stopped_early=bool(trial.is_trial_stopped_early),
        values=trial.hyperparameters,
    )


def competing_objective(point: TrialPoint) -> float | None:
    """The objective a trial competes for the best with; None unless it finished with an
    objective and ran to its end."""
    return None if point.stopped_early else point.objective


def best_so_far(points: list[TrialPoint], goal: Goal) -> list[tuple[int, float]]:
    """(trial number, best objective up to it) at each trial that counts."""
    better = min if goal is Goal.MINIMIZE else max
    line: list[tuple[int, float]] = []
    for point in points:
        objective = competing_objective(point)
        if objective is not None:
            line.append((point.number, better(line[-1][1], objective) if line else objective))
    return line


def plot_study(job: Job, path: Path) -> None:
    """Draw the study of an HP job into `path` (png, svg, pdf: what the suffix says)."""
    points = trial_points(job)
    plt = _pyplot()
    spec = _tuning_spec(job)
    panels = 1 + len(spec.parameters)
    rows, columns = math.ceil(panels / COLUMNS), min(panels, COLUMNS)
    figure, axes = plt.subplots(rows, columns, squeeze=False,
                                figsize=(PANEL_INCHES[0] * columns, PANEL_INCHES[1] * rows))
    try:
        fmt = _format(figure, path)
        flat = list(axes.flat)
        metric = (job.training_output and job.training_output.hyperparameter_metric_tag) or spec.metric_tag
        _objective_panel(flat[0], points, spec.effective_goal, metric)
        for ax, param in zip(flat[1:], spec.parameters, strict=False):
            _parameter_panel(ax, points, param, metric)
        for ax in flat[panels:]:
            ax.set_visible(False)
        figure.suptitle(f"{job.job_id}: {spec.effective_goal.value.lower()} {metric}")
        figure.tight_layout()
        try:
            figure.savefig(path, format=fmt, dpi=100)
        except OSError as exc:
            raise ValidationError(f"Cannot write [{path}]: {exc.strerror or exc}.") from None
    finally:
        plt.close(figure)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise EnvironmentNotReady("jobs plot needs matplotlib: pip install 'aiptrain[plot]'") from None
    matplotlib.use("Agg")  # files only; never a display
    import matplotlib.pyplot as plt

    return plt


def _format(figure, path: Path) -> str:
    fmt = path.suffix.lstrip(".").lower()
    supported = figure.canvas.get_supported_filetypes()
    if fmt not in supported:
        raise ValidationError(f"Cannot draw [{path}]: name a file ending in one of "
                              f"{', '.join('.' + name for name in sorted(supported))}.")
    return fmt


def _scatter(ax, points: list[TrialPoint], x_of) -> None:
    """Trials with an objective: finished ones filled, ones stopped early hollow."""
    for stopped, style in ((False, {"color": "tab:blue", "label": "trial"}),
                           (True, {"facecolors": "none", "edgecolors": "tab:orange", "label": "stopped early"})):
        group = [p for p in points if p.objective is not None and p.stopped_early is stopped]
        if group:
            ax.scatter([x_of(p) for p in group], [p.objective for p in group], **style)


def _objective_panel(ax, points: list[TrialPoint], goal: Goal, metric: str) -> None:
    from matplotlib.ticker import MaxNLocator

    _scatter(ax, points, lambda p: p.number)
    failed = [p for p in points if p.objective is None]
    if failed:  # no objective: marked along the bottom of the panel
        ax.scatter([p.number for p in failed], [0.0] * len(failed), marker="x", color="tab:red",
                   transform=ax.get_xaxis_transform(), clip_on=False, label="failed")
    best = best_so_far(points, goal)
    if best:  # none when every trial with an objective was stopped early
        best.append((points[-1].number, best[-1][1]))  # the line runs on to the last trial
        ax.step([n for n, _ in best], [v for _, v in best], where="post", color="tab:green", label="best so far")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title("objective per trial")
    ax.legend(fontsize="small")


def _parameter_panel(ax, points: list[TrialPoint], param: ParameterSpec, metric: str) -> None:
    name = param.name
    shown = [p for p in points if name in p.values]
    if param.type is ParameterType.CATEGORICAL:
        categories = list(param.categorical_values or ())
        categories += sorted({p.values[name] for p in shown} - set(categories))  # values of an older spec
        _scatter(ax, shown, lambda p: categories.index(p.values[name]))
        ax.set_xticks(range(len(categories)), categories)
        ax.set_xlim(-0.5, len(categories) - 0.5)
    else:
        _scatter(ax, shown, lambda p: float(p.values[name]))
        if param.scale_type is ScaleType.UNIT_LOG_SCALE:
            ax.set_xscale("log")
    ax.set_xlabel(name)
    ax.set_ylabel(metric)
    ax.set_title(f"{name} ({param.type.value})" if param.type else name)

"""Hyperparameter tuning's pure rules: `schedule()` (how many trials to start now, and when the
study is over), the failure limit, the sampler's seed, when a condemned trial stops.

The study itself (trials launched, stepped and ended as groups of the job's driver) is
aiptrain.runner.study; the search (which values a trial gets) is aiptrain.search, on optuna.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from aiptrain.model import Goal, HyperparameterSpec, State
from aiptrain.planning import Trial

log = logging.getLogger(__name__)

STUDY_SEED = 0  # the same spec explores the same points: studies are reproducible


# -- the study rule (pure) --------------------------------------------------------------------


@dataclass(frozen=True)
class StudyCounts:
    """Where a study stands."""

    budget: int  # trials it may run in all (maxTrials, or fewer when the search space is smaller)
    started: int
    running: int
    succeeded: int
    failed: int


@dataclass(frozen=True)
class StudyStep:
    start: int = 0  # trials to start now
    end: State | None = None  # the job's final state, once the study is over
    reason: str | None = None  # why it failed


def failure_limit(max_failed_trials: int | None, budget: int) -> int:
    """How many failed trials fail the job. maxFailedTrials 0 (unset) leaves it to the
    service; aiptrain's rule is half the trials, rounded up: a trainer that fails every
    time stops early, one that fails now and then still finishes its study."""
    if max_failed_trials:
        return max_failed_trials
    return max(1, math.ceil(budget / 2))


def schedule(counts: StudyCounts, max_parallel: int, max_failed: int | None) -> StudyStep:
    """What to do next: start trials up to `max_parallel` at once (maxParallelTrials, or as many
    as the machine runs when fewer: aiptrain.admission.trials_at_once) while the budget lasts;
    fail the job once too many trials failed; end it when nothing runs and nothing is left."""
    limit = failure_limit(max_failed, counts.budget)
    if counts.failed >= limit:
        return StudyStep(end=State.FAILED, reason=f"{counts.failed} of the trials failed (the limit is {limit}).")
    room = min(max_parallel - counts.running, counts.budget - counts.started)
    if room > 0:
        return StudyStep(start=room)
    if counts.running == 0:
        if counts.succeeded:
            return StudyStep(end=State.SUCCEEDED)
        return StudyStep(end=State.FAILED, reason="No trial succeeded.")
    return StudyStep()


def final_report(reports: list[tuple[int, float]], goal: Goal, best: bool) -> tuple[int, float]:
    """A trial's final metric out of its (step, value) reports, oldest first: its last, or with
    `best` its best for the goal (the earliest of equal ones)."""
    if not best:
        return reports[-1]
    pick = min if goal is Goal.MINIMIZE else max
    return pick(reports, key=lambda report: report[1])


def sampler_seed(trials_known: int) -> int:
    """The search's seed when it starts with this many trials already recorded (its own, and a
    previous job's): a fresh study's is STUDY_SEED, so it is reproducible; a study taken over by
    a new controller, or resumed by a new job, draws a sequence it has not drawn yet instead of
    replaying the one its earlier trials took."""
    return STUDY_SEED + trials_known


def first_trial(spec: HyperparameterSpec, metrics_dir: str) -> Trial:
    """The trial the study starts with: what `--dry-run` shows of a tuning job."""
    # optuna (0.6 s here), through aiptrain.search: only a tuning job's dry run pays for it.
    from aiptrain.search import Search  # noqa: PLC0415

    return Trial("1", Search(spec, seed=sampler_seed(0)).suggest("1") or {}, metrics_dir)


def stop_now(condemned_at: int | None, reports: int) -> bool:
    """Whether a trial the pruner condemned after its `condemned_at`-th report is stopped, now
    that it has made `reports`. Only once it reported again: a condemning report may be the
    trainer's final one (it is saving its model, about to exit 0), and a trial that made its
    final report finished; it was not stopped early."""
    return condemned_at is not None and reports > condemned_at

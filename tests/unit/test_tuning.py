"""The study rule and the metric files, without Docker."""

import json

import pytest

from aiptrain.model import Goal, State
from aiptrain.trial_metrics import parse_hypertune, read_hypertune
from aiptrain.tuning import StudyCounts, StudyStep, failure_limit, final_report, schedule, stop_now


def counts(budget=6, started=0, running=0, succeeded=0, failed=0):
    return StudyCounts(budget, started, running, succeeded, failed)


@pytest.mark.parametrize(
    "name, state, max_parallel, max_failed, expected",
    [
        ("a new study fills its parallel slots", counts(), 2, None, StudyStep(start=2)),
        ("never more than the budget", counts(budget=3, started=2, running=1, succeeded=1), 4, None,
         StudyStep(start=1)),
        ("full slots: wait", counts(started=2, running=2), 2, None, StudyStep()),
        ("one slot freed", counts(started=2, running=1, succeeded=1), 2, None, StudyStep(start=1)),
        ("budget spent, trials still running: wait", counts(started=6, running=1, succeeded=5), 2, None,
         StudyStep()),
        ("budget spent, nothing running: done", counts(started=6, succeeded=5, failed=1), 2, None,
         StudyStep(end=State.SUCCEEDED)),
        ("every trial failed below the limit still ends FAILED", counts(budget=1, started=1, failed=0), 1, 5,
         StudyStep(end=State.FAILED, reason="No trial succeeded.")),
        ("maxFailedTrials reached", counts(started=3, running=1, succeeded=0, failed=2), 2, 2,
         StudyStep(end=State.FAILED, reason="2 of the trials failed (the limit is 2).")),
        ("below maxFailedTrials: go on", counts(started=3, running=1, succeeded=1, failed=1), 2, 2,
         StudyStep(start=1)),
        ("default limit is half the budget", counts(started=4, running=1, failed=3), 2, 0,
         StudyStep(end=State.FAILED, reason="3 of the trials failed (the limit is 3).")),
        ("an exhausted grid ends early", counts(budget=4, started=4, succeeded=4), 2, None,
         StudyStep(end=State.SUCCEEDED)),
    ],
)
def test_schedule(name, state, max_parallel, max_failed, expected):
    assert schedule(state, max_parallel, max_failed) == expected, name


@pytest.mark.parametrize("given, budget, limit", [(None, 6, 3), (0, 1, 1), (0, 7, 4), (2, 100, 2)])
def test_failure_limit(given, budget, limit):
    assert failure_limit(given, budget) == limit


def test_read_metrics_takes_the_tag_in_hypertunes_format(tmp_path):
    path = tmp_path / "master-replica-0.metrics"
    lines = [
        {"accuracy": "0.5", "global_step": "100", "timestamp": 1.0, "trial": "1"},
        {"loss": "0.3", "global_step": "150", "timestamp": 1.5, "trial": "1"},
        {"accuracy": "0.75", "global_step": "200", "timestamp": 2.0, "trial": "1"},
    ]
    path.write_text("\n".join(json.dumps(line, sort_keys=True) for line in lines) + "\n{\"accur")
    assert read_hypertune(tmp_path, path.name, "accuracy") == [(100, 0.5), (200, 0.75)]
    assert read_hypertune(tmp_path, path.name, "loss") == [(150, 0.3)]
    assert read_hypertune(tmp_path, "missing", "accuracy") == []


def test_read_metrics_skips_values_that_are_not_numbers():
    text = '{"m": "nan", "global_step": "1"}\n{"m": "x"}\n{"m": "2", "global_step": ""}\n{"m": "1", "global_step": "1e999"}\n'
    assert parse_hypertune(text, "m") == [(0, 2.0)]


@pytest.mark.parametrize(
    "name, condemned_at, reports, stop",
    [
        ("never condemned", None, 5, False),
        ("condemned at its newest report: it may be the final one", 3, 3, False),
        ("it reported again: the condemning report was not its last", 3, 4, True),
        ("condemned at its first report, reported twice since", 1, 3, True),
    ],
)
def test_a_trial_is_stopped_early_only_after_a_report_past_the_condemning_one(name, condemned_at, reports, stop):
    assert stop_now(condemned_at, reports) is stop, name


REPORTS = [(1, 0.5), (2, 0.9), (3, 0.2), (4, 0.9), (5, 0.7)]


@pytest.mark.parametrize("goal, best, expected", [
    (Goal.MAXIMIZE, False, (5, 0.7)),  # the last report, as the service took it
    (Goal.MINIMIZE, False, (5, 0.7)),
    (Goal.MAXIMIZE, True, (2, 0.9)),  # the best for the goal, the earliest of equals
    (Goal.MINIMIZE, True, (3, 0.2)),
])
def test_final_report_is_the_last_or_the_best(goal, best, expected):
    assert final_report(REPORTS, goal, best) == expected

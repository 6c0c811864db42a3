"""Admission (aiptrain.admission): the pure rule, table-tested, and the store's queue."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from aiptrain.admission import (
    NO_CAP,
    REPLICA_MEMORY_BYTES,
    REPLICAS_PER_CORE,
    Capacity,
    Queued,
    capacity,
    decide,
    needed_by,
    replicas_needed,
    trials_at_once,
    trials_held,
    waited_too_long,
)
from aiptrain.model import HyperparameterSpec, Job, ParameterSpec, State, TrainingInput
from aiptrain.store import JobStore

GIB = 1 << 30
CAP_4 = Capacity(4, "AIPTRAIN_MAX_RUNNING_REPLICAS=4")


@pytest.mark.parametrize(
    "job_id, queue, used, admitted, position",
    [
        ("a", [("a", 1)], 0, True, 0),  # nothing runs: starts
        ("a", [("a", 3)], 1, True, 0),  # fits exactly: 1 + 3 <= 4
        ("a", [("a", 4)], 1, False, 1),  # does not fit: waits at the head
        ("a", [("a", 9)], 0, True, 0),  # larger than the cap, but nothing else runs: starts alone
        ("a", [("a", 9)], 1, False, 1),  # larger than the cap while something runs: waits
        ("b", [("a", 8), ("b", 1)], 0, False, 2),  # FIFO: a small job never overtakes an older big one
        ("c", [("a", 1), ("b", 1), ("c", 1)], 0, False, 3),
    ],
)
def test_only_the_oldest_waiting_job_starts_and_only_if_it_fits_or_runs_alone(job_id, queue, used, admitted, position):
    verdict = decide(job_id, [Queued(*entry) for entry in queue], used, CAP_4)
    assert (verdict.admitted, verdict.position) == (admitted, position)
    assert (verdict.reason is None) == admitted


def test_reasons_say_why_a_job_waits():
    behind = decide("c", [Queued("a", 1), Queued("b", 1), Queued("c", 1)], 0, CAP_4)
    assert "behind 2 jobs submitted earlier" in behind.reason
    full = decide("a", [Queued("a", 2)], 3, CAP_4)
    assert "3 replicas of other jobs running" in full.reason and "needs 2" in full.reason
    assert "at most 4" in full.reason and "AIPTRAIN_MAX_RUNNING_REPLICAS=4" in full.reason


@pytest.mark.parametrize(
    "used, cpus, free, override, cap",
    [
        (0, 2, 64 * GIB, None, 2 * REPLICAS_PER_CORE),  # cores bound it
        (0, 16, 3 * GIB, None, 3),  # free memory bounds it
        (2, 16, 3 * GIB, None, 5),  # memory the running replicas hold counts as theirs, not as taken
        (0, 8, GIB // 2, None, 1),  # never below one
        (0, 2, 64 * GIB, 1, 1),  # the environment variable wins
        (0, 2, 0, 0, NO_CAP),  # 0: no cap at all
    ],
)
def test_capacity_counts_cores_and_free_memory_unless_overridden(used, cpus, free, override, cap):
    assert capacity(used, cpus, free, override).replicas == cap


def test_one_replica_is_counted_for_a_gib():
    assert REPLICA_MEMORY_BYTES == GIB


@pytest.mark.parametrize(
    "waited, max_wait, expired",
    [(10, None, False), (10, 30.0, False), (31, 30.0, True)],
)
def test_max_wait_time_expires_only_when_set_and_past(waited, max_wait, expired):
    created = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert waited_too_long(created, created + timedelta(seconds=waited), max_wait) is expired


def _study(parallel: int | None, trials: int | None, tier: str = "STANDARD_1") -> Job:
    spec = HyperparameterSpec(
        goal="MAXIMIZE", max_trials=trials, max_parallel_trials=parallel, hyperparameter_metric_tag="m",
        params=[ParameterSpec(parameter_name="lr", type="DOUBLE", min_value=0.1, max_value=1.0)],
    )
    return Job(job_id="s", training_input=TrainingInput(scale_tier=tier, hyperparameters=spec))


def test_a_study_holds_its_parallel_trials_replicas():
    no_cap = {"cpus": 2, "override": 0}
    assert needed_by(Job(job_id="j", training_input=TrainingInput(scale_tier="STANDARD_1")), **no_cap) == 8
    assert needed_by(_study(parallel=3, trials=10), **no_cap) == 24
    assert needed_by(_study(parallel=5, trials=2), **no_cap) == 16  # never more trials at once than it runs
    assert needed_by(_study(parallel=None, trials=None, tier="BASIC"), **no_cap) == 1
    assert replicas_needed(2, 0) == 2


@pytest.mark.parametrize(
    "parallel, trials, tier, cpus, override, held",
    [
        (3, 10, "BASIC", 2, None, 3),  # 3 trials of 1 fit under 2 per core on 2 cores
        (5, 10, "BASIC", 2, None, 4),  # 5 do not: the 4 that fit
        (5, 10, "BASIC", 2, 1, 1),  # AIPTRAIN_MAX_RUNNING_REPLICAS=1: one trial at a time
        (4, 10, "STANDARD_1", 2, 16, 16),  # 2 trials of 8
        (4, 10, "STANDARD_1", 2, 4, 8),  # a trial of 8 over a cap of 4: one, held alone, as a plain job of 8
        (4, 10, "STANDARD_1", 2, None, 8),
        (5, 10, "BASIC", 2, 0, 5),  # no cap: maxParallelTrials
        (None, None, "STANDARD_1", 2, 4, 8),  # maxParallelTrials 1 over the cap: as a plain job
    ],
)
def test_a_study_larger_than_the_machine_holds_the_trials_that_fit(parallel, trials, tier, cpus, override, held):
    """Never refused: admission counts the trials the study runs at once here, a plain job's way
    when one trial alone is over the cap."""
    assert needed_by(_study(parallel=parallel, trials=trials, tier=tier), cpus, override) == held


@pytest.mark.parametrize(
    "parallel, trials, per_trial, cpus, override, at_once, bounded",
    [
        (4, 20, 1, 2, None, 4, False),  # fits: as asked
        (4, 3, 1, 2, 1, 1, True),  # maxTrials 3 asks for 3 at once: one here
        (5, 20, 1, 2, None, 4, True),  # the cores bound it (2 per core)
        (5, 20, 1, 16, None, 5, False),
        (5, 20, 1, 2, 4, 4, True),  # the override bounds it
        (5, 20, 2, 2, 5, 2, True),  # 2 trials of 2 replicas fit in 5
        (5, 20, 8, 2, 4, 1, True),  # a trial over the cap: one at a time (it runs alone)
        (1, 20, 8, 2, 4, 1, False),  # one at a time as asked: nothing to say
        (100, 1000, 1, 2, 0, 100, False),  # no cap
    ],
)
def test_trials_at_once_are_those_that_fit_under_the_cap(parallel, trials, per_trial, cpus, override, at_once, bounded):
    bound = trials_at_once(_study(parallel, trials).training_input.hyperparameters, per_trial, cpus, override)
    assert (bound.trials, bound.bounded, bound.notice() is not None) == (at_once, bounded, bounded)


def test_a_bounded_study_says_how_many_trials_run_here_why_and_how_to_change_it():
    spec = _study(parallel=5, trials=20).training_input.hyperparameters
    assert trials_at_once(spec, 1, 2, 4).notice() == (
        "trainingInput.hyperparameters.maxParallelTrials [5]: this machine runs 4 of the study's trials at once "
        "(1 replica each; at most 4 replicas at once: AIPTRAIN_MAX_RUNNING_REPLICAS=4), and starts its other trials "
        "as earlier ones end. Set AIPTRAIN_MAX_RUNNING_REPLICAS to change it (0: no cap)."
    )
    derived = trials_at_once(spec, 2, 1, None).notice()
    assert "runs 1 of the study's trials at once (2 replicas each; at most 2 replicas at once: 2 per core on 1 " \
           "core)" in derived
    assert "(1 replica each; at most 1 replica at once: AIPTRAIN_MAX_RUNNING_REPLICAS=1)" in \
        trials_at_once(spec, 1, 2, 1).notice()
    alone = trials_at_once(spec, 8, 2, 4).notice()
    assert "(8 replicas each; at most 4 replicas at once: AIPTRAIN_MAX_RUNNING_REPLICAS=4; a trial larger than " \
           "that runs alone)" in alone
    assert "\n" not in alone


@pytest.mark.parametrize(
    "held, per_trial, asked, at_once",
    [(4, 1, 5, 4), (8, 8, 4, 1), (24, 8, 3, 3), (16, 8, 4, 2), (9, 2, 3, 3), (100, 1, 2, 2), (0, 1, 3, 1)],
)
def test_a_study_runs_as_many_trials_as_its_admitted_replicas_hold(held, per_trial, asked, at_once):
    assert trials_held(held, per_trial, asked) == at_once


# -- the store's queue ----------------------------------------------------------------------------


@pytest.fixture
def store(store_location):
    store = JobStore(store_location)
    yield store
    store.close()


def _request(store: JobStore, job_id: str, need: int, cap: int = 2):
    store.create(Job(job_id=job_id)) if not store.exists(job_id) else None
    return store.request_admission(
        job_id, need, lambda queue, used: decide(job_id, queue, used, Capacity(cap, f"cap {cap}"))
    )


def test_store_admits_in_order_and_frees_capacity_when_a_job_ends(store):
    assert _request(store, "a", 2).admitted
    assert store.get("a").state is State.PREPARING
    assert store.held_replicas("a") == 2 and store.held_replicas("unknown") is None
    b, c = _request(store, "b", 1), _request(store, "c", 1)
    assert (b.admitted, c.admitted) == (False, False)
    assert store.queue_position("b") == (1, b.reason) and store.queue_position("c") == (2, c.reason)
    assert not _request(store, "c", 1).admitted  # still behind b
    store.transition("a", State.RUNNING, [State.PREPARING])
    store.transition("a", State.SUCCEEDED, [State.RUNNING])
    assert store.admission_queue() == ([Queued("b", 1), Queued("c", 1)], 0)
    assert _request(store, "b", 1).admitted and _request(store, "c", 1).admitted  # 1 + 1 fit in 2
    assert store.admission_queue() == ([], 2)
    assert store.queue_position("b") is None


def test_a_job_cancelled_while_queued_is_not_admitted_and_leaves_the_queue(store):
    assert _request(store, "a", 2).admitted
    assert not _request(store, "b", 1).admitted
    store.transition("b", State.CANCELLING, [State.QUEUED])
    store.transition("a", State.FAILED, [State.PREPARING])
    assert not _request(store, "b", 1).admitted
    assert store.get("b").state is State.CANCELLING
    store.transition("b", State.CANCELLED, [State.CANCELLING])
    assert store.admission_queue() == ([], 0) and not store.is_enqueued("b")


@pytest.mark.parametrize("value, cap", [("", None), ("0", 0), ("3", 3)])
def test_the_cap_variable_is_read_in_settings(monkeypatch, value, cap):
    from aiptrain.settings import Settings

    monkeypatch.setenv("AIPTRAIN_MAX_RUNNING_REPLICAS", value)
    assert Settings().max_running_replicas == cap


@pytest.mark.parametrize("value, problem", [("-1", "is negative"), ("x", "is not a number")])
def test_a_bad_cap_variable_is_one_clear_error(monkeypatch, value, problem):
    from aiptrain.errors import ValidationError
    from aiptrain.settings import Settings

    monkeypatch.setenv("AIPTRAIN_MAX_RUNNING_REPLICAS", value)
    with pytest.raises(ValidationError, match=f"AIPTRAIN_MAX_RUNNING_REPLICAS \\[{value}\\] {problem}"):
        Settings()

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
    assert needed_by(Job(job_id="j", training_input=TrainingInput(scale_tier="STANDARD_1"))) == 8
    assert needed_by(_study(parallel=3, trials=10)) == 24
    assert needed_by(_study(parallel=5, trials=2)) == 16  # never more trials at once than it runs
    assert needed_by(_study(parallel=None, trials=None, tier="BASIC")) == 1
    assert replicas_needed(2, 0) == 2


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

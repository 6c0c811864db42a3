"""The job store under concurrent writers."""

import multiprocessing

import pytest

from aiptrain.errors import ValidationError
from aiptrain.model import Job, State, TrainingInput
from aiptrain.store import JobStore


def test_transitions_are_compare_and_set_with_times(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    store.create(Job(job_id="a", training_input=TrainingInput(region="r")))
    assert store.transition("a", State.RUNNING, [State.PREPARING]) is None  # it is QUEUED, not PREPARING
    assert store.transition("a", State.PREPARING, [State.QUEUED]).state is State.PREPARING
    running = store.transition("a", State.RUNNING, [State.PREPARING])
    assert running.start_time is not None and running.end_time is None
    done = store.transition("a", State.FAILED, [State.RUNNING], error_message="boom")
    assert (done.state, done.error_message) == (State.FAILED, "boom") and done.end_time is not None
    assert store.transition("a", State.SUCCEEDED, [State.RUNNING]) is None
    assert [state for _, state, _ in store.events("a")] == ["QUEUED", "PREPARING", "RUNNING", "FAILED"]


def test_duplicate_ids_are_rejected(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    store.create(Job(job_id="a"))
    with pytest.raises(ValidationError, match="already exists"):
        store.create(Job(job_id="a"))


def _create_many(path, worker, results):
    store = JobStore(path)
    for i in range(20):
        for job_id in (f"shared_{i}", f"own_{worker}_{i}"):
            try:
                store.create(Job(job_id=job_id))
                results.put(job_id)
            except ValidationError:
                pass


def test_concurrent_processes_never_create_the_same_job_twice(tmp_path):
    path = tmp_path / "jobs.db"
    JobStore(path).close()
    results = multiprocessing.Queue()
    workers = [multiprocessing.Process(target=_create_many, args=(path, w, results)) for w in range(6)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(60)
    created = [results.get() for _ in range(results.qsize())]
    assert sorted(created) == sorted({*created})  # nobody created an ID twice
    assert len([c for c in created if c.startswith("shared_")]) == 20
    assert len(JobStore(path).list()) == 20 + 6 * 20


def test_restart_counts_persist(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    store.create(Job(job_id="a"))
    store.count_restart("a", "worker-replica-1")
    assert JobStore(tmp_path / "jobs.db").count_restart("a", "worker-replica-1") == 2


def _open_and_create(args):
    path, index = args
    from aiptrain.model import Job
    from aiptrain.store import JobStore

    try:
        JobStore(path).create(Job(job_id=f"first_{index}"))
        return "ok"
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return repr(exc)


def test_many_processes_opening_a_new_store_at_once_all_get_it(tmp_path):
    """Every CLI process opens the store; the first ones to meet a new home create it together."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(8) as pool:
        for round_ in range(3):
            path = tmp_path / f"home-{round_}" / "jobs.db"
            assert pool.map(_open_and_create, [(path, i) for i in range(8)]) == ["ok"] * 8


def test_the_table_names_every_active_state():
    from aiptrain.jobtable import ACTIVE
    from aiptrain.model import TERMINAL_STATES

    assert {State(name) for name in ACTIVE} == set(State) - TERMINAL_STATES


def test_active_jobs_are_found_through_the_state_index(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    for job_id, state in (("a", State.RUNNING), ("b", State.SUCCEEDED), ("c", State.CANCELLING)):
        store.create(Job(job_id=job_id))
        store.transition(job_id, state, [State.QUEUED])
    store.create(Job(job_id="d"))
    assert sorted(store.active_job_ids()) == ["a", "c", "d"]
    plan = " ".join(str(row) for row in store._db.execute(
        "EXPLAIN QUERY PLAN SELECT job_id FROM jobs WHERE state IN ('QUEUED', 'RUNNING')"))
    assert "jobs_by_state" in plan

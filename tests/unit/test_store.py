"""The job store under concurrent writers, on SQLite and on PostgreSQL (the `store_location`
fixture runs each test on both)."""

import multiprocessing

import pytest

from aiptrain.errors import ValidationError
from aiptrain.model import Job, State, TrainingInput, TrainingOutput
from aiptrain.store import JobStore


def test_transitions_are_compare_and_set_with_times(store_location):
    store = JobStore(store_location)
    store.create(Job(job_id="a", training_input=TrainingInput(region="r")))
    assert store.transition("a", State.RUNNING, [State.PREPARING]) is None  # it is QUEUED, not PREPARING
    assert store.transition("a", State.PREPARING, [State.QUEUED]).state is State.PREPARING
    running = store.transition("a", State.RUNNING, [State.PREPARING])
    assert running.start_time is not None and running.end_time is None
    done = store.transition("a", State.FAILED, [State.RUNNING], error_message="boom")
    assert (done.state, done.error_message) == (State.FAILED, "boom") and done.end_time is not None
    assert store.transition("a", State.SUCCEEDED, [State.RUNNING]) is None
    assert [state for _, state, _ in store.events("a")] == ["QUEUED", "PREPARING", "RUNNING", "FAILED"]


def test_duplicate_ids_are_rejected(store_location):
    store = JobStore(store_location)
    store.create(Job(job_id="a"))
    with pytest.raises(ValidationError, match="already exists"):
        store.create(Job(job_id="a"))


def test_writes_of_parts_never_undo_a_transition(store_location):
    """update_resource keeps the stored state; set_training_output replaces trainingOutput alone;
    a later verdict replaces an earlier one."""
    store = JobStore(store_location)
    created = store.create(Job(job_id="a", labels={"team": "ml"}))
    store.transition("a", State.FAILED, [State.QUEUED], error_message="boom")
    store.update_resource("a", created.model_copy(update={"training_input": TrainingInput(region="r2")}))
    job = store.get("a")
    assert (job.state, job.error_message, job.training_input.region) == (State.FAILED, None, "r2")
    store.transition("a", State.FAILED, [State.FAILED], error_message="boom")
    store.set_training_output("a", TrainingOutput(completed_trial_count=3))
    job = store.get("a")
    assert (job.state, job.error_message, job.training_output.completed_trial_count) == (State.FAILED, "boom", 3)
    assert job.labels == {"team": "ml"}
    store.record_verdict("a", {"state": "FAILED"})
    store.record_verdict("a", {"state": "SUCCEEDED"})
    assert store.verdict("a") == {"state": "SUCCEEDED"} and store.verdict("b") is None
    store.set_training_output("b", TrainingOutput(completed_trial_count=1))  # no such job: nothing happens
    assert store.get("b") is None


def _create_many(path, worker, results):
    store = JobStore(path)
    for i in range(20):
        for job_id in (f"shared_{i}", f"own_{worker}_{i}"):
            try:
                store.create(Job(job_id=job_id))
                results.put(job_id)
            except ValidationError:
                pass


def test_concurrent_processes_never_create_the_same_job_twice(store_location):
    path = store_location
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
    assert len(JobStore(path).all()) == 20 + 6 * 20


def test_restart_counts_persist(store_location):
    store = JobStore(store_location)
    store.create(Job(job_id="a"))
    store.count_restart("a", "worker-replica-1")
    assert JobStore(store_location).count_restart("a", "worker-replica-1") == 2


def _race_transitions(location, job_ids, start, results):
    """Wait for the start, then try to move each job out of QUEUED; report the ones won."""
    store = JobStore(location)
    start.wait(60)
    for job_id in job_ids:
        if store.transition(job_id, State.PREPARING, [State.QUEUED], detail=f"pid {multiprocessing.current_process().pid}"):
            results.put(job_id)
    store.close()


def test_concurrent_transitions_of_the_same_job_have_exactly_one_winner(store_location):
    """Several processes move the same jobs out of QUEUED at the same moment: one wins each."""
    store = JobStore(store_location)
    job_ids = [f"raced_{i}" for i in range(30)]
    for job_id in job_ids:
        store.create(Job(job_id=job_id))
    start, results = multiprocessing.Event(), multiprocessing.Queue()
    workers = [multiprocessing.Process(target=_race_transitions, args=(store_location, job_ids, start, results))
               for _ in range(6)]
    for process in workers:
        process.start()
    start.set()
    for process in workers:
        process.join(120)
    assert [process.exitcode for process in workers] == [0] * len(workers)
    won = [results.get(timeout=10) for _ in job_ids]
    assert sorted(won) == sorted(job_ids) and results.empty()  # each job won once, by someone
    for job_id in job_ids:
        assert [state for _, state, _ in store.events(job_id)] == ["QUEUED", "PREPARING"]
        assert store.get(job_id).state is State.PREPARING


def _open_and_create(args):
    path, index = args
    from aiptrain.model import Job
    from aiptrain.store import JobStore

    try:
        JobStore(path).create(Job(job_id=f"first_{index}"))
        return "ok"
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return repr(exc)


def test_many_processes_opening_a_new_store_at_once_all_get_it(tmp_path, request, store_location):
    """Every CLI process opens the store; the first ones to meet a new home create it together."""
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        for round_ in range(3):
            if isinstance(store_location, str):  # an empty database each round
                location = request.getfixturevalue("postgres_server").new_database()
            else:
                location = tmp_path / f"home-{round_}" / "jobs.db"
            assert pool.map(_open_and_create, [(location, i) for i in range(8)]) == ["ok"] * 8


def test_the_table_names_every_active_state():
    from aiptrain.jobtable import ACTIVE
    from aiptrain.model import TERMINAL_STATES

    assert {State(name) for name in ACTIVE} == set(State) - TERMINAL_STATES


def test_active_jobs_are_found_through_the_state_index(tmp_path, store_location):
    store = JobStore(store_location)
    for job_id, state in (("a", State.RUNNING), ("b", State.SUCCEEDED), ("c", State.CANCELLING)):
        store.create(Job(job_id=job_id))
        store.transition(job_id, state, [State.QUEUED])
    store.create(Job(job_id="d"))
    assert sorted(store.active_job_ids()) == ["a", "c", "d"]
    if isinstance(store_location, str):
        store._db.execute("SET enable_seqscan = off")  # a table this small is read whole otherwise
        plan = " ".join(str(row) for row in store._db.execute(
            "EXPLAIN SELECT job_id FROM jobs WHERE state IN ('QUEUED', 'RUNNING')"))
        assert "jobs_by_state" in plan
        return
    plan = " ".join(str(row) for row in store._db.execute(
        "EXPLAIN QUERY PLAN SELECT job_id FROM jobs WHERE state IN ('QUEUED', 'RUNNING')"))
    assert "jobs_by_state" in plan

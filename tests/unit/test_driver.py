"""JobDriver.step() against the fake backend (tests/fakes.py): every phase of a job, stepped as the
controller steps it, in milliseconds. The engine side of the same rules runs in the *_docker tests."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta

import pytest

from aiptrain.admission import request
from aiptrain.backends import ReplicaStatus
from aiptrain.errors import EnvironmentNotReady
from aiptrain.logs import read_records
from aiptrain.model import Job, ReplicaConfig, Scheduling, State, TrainingInput, utc_now
from aiptrain.planning import PlanInputs, save_plan_inputs
from aiptrain.runner.driver import INTERRUPTED, JobDriver, Phase
from aiptrain.runner.groups import DRAIN_LOOK_SECONDS
from aiptrain.settings import Settings
from aiptrain.store import JobStore

from fakes import FakeBackend, plan_of

BASIC = TrainingInput(scale_tier="BASIC", region="us-central1", python_module="trainer.task",
                      package_uris=["gs://b/trainer.tar.gz"])
WITH_WORKER_AND_EVALUATOR = TrainingInput(
    scale_tier="CUSTOM", master_type="n1-standard-4", worker_type="n1-standard-4", worker_count=1,
    evaluator_type="n1-standard-4", evaluator_count=1, region="us-central1", python_module="trainer.task",
    package_uris=["gs://b/trainer.tar.gz"], master_config=ReplicaConfig(image_uri="example.com/t:1"))


@pytest.fixture
def settings(tmp_path) -> Settings:
    settings = Settings(home=tmp_path / "home", max_restarts=2, evaluator_grace_seconds=0, poll_seconds=0.01)
    settings.ensure_dirs()
    return settings


@pytest.fixture
def store(settings):
    with JobStore(settings.store_path) as store:
        yield store


def submitted(store: JobStore, settings: Settings, job_id: str = "job", training_input: TrainingInput = BASIC,
              cap: int | None = None, **fields) -> Job:
    """A job as submit leaves it: recorded, its plan inputs saved, asked for admission."""
    job = store.create(Job(job_id=job_id, training_input=training_input, **fields))
    save_plan_inputs(settings.job_paths(job_id).plan_inputs, PlanInputs(runtime_image="aiptrain/runtime:minimal"))
    request(store, job_id, job, cap)
    return job


def drive(driver: JobDriver, backend: FakeBackend, between=None, max_steps: int = 500) -> State | None:
    """Step the driver as the controller would; the fake engine's clock moves between steps."""
    for n in range(max_steps):
        if driver.step() is None:
            return driver.final_state
        if driver.phase is Phase.ENDING:  # the drain waits on the log followers' threads: let them run
            time.sleep(DRAIN_LOOK_SECONDS)
        backend.advance()
        if between:
            between(n)
    raise AssertionError(f"still {driver.phase} after {max_steps} steps")


def service_lines(settings: Settings, job_id: str = "job") -> list[str]:
    return [r.message for r in read_records(settings.job_paths(job_id).log)[0] if r.task == "service"]


@pytest.mark.parametrize("script, state, restarts, error", [
    ({"master-replica-0": [0]}, State.SUCCEEDED, 0, None),
    ({"master-replica-0": [137, 0]}, State.SUCCEEDED, 1, None),
    ({"master-replica-0": [143, 130, 0]}, State.SUCCEEDED, 2, None),
    ({"master-replica-0": [137, 137, 137]}, State.FAILED, 2, "exited with a non-zero status of 137"),
    ({"master-replica-0": [1]}, State.FAILED, 0, "The replica master 0 exited with a non-zero status of 1."),
])
def test_a_basic_job_from_launch_to_its_end(settings, store, script, state, restarts, error):
    submitted(store, settings)
    backend = FakeBackend(script=script)
    assert drive(JobDriver("job", settings, store, backend), backend) is state
    job = store.get("job")
    assert job.state is state and len(backend.restarted) == restarts
    assert (error is None) == (job.error_message is None)
    if error:
        assert error in job.error_message
    assert backend.removed[-1] == ("job", None) and not backend.replicas
    assert not settings.job_paths("job").work_dir.exists()
    lines = service_lines(settings)
    assert lines[0] == "Waiting for job to be provisioned." and lines[-1] in (
        "Job completed successfully.", "Job failed.")
    assert sum("Restarting it in place" in line for line in lines) == restarts


def test_a_failed_worker_fails_the_job_and_the_others_are_stopped(settings, store):
    submitted(store, settings, training_input=WITH_WORKER_AND_EVALUATOR)
    backend = FakeBackend(script={"worker-replica-0": [1]})
    assert drive(JobDriver("job", settings, store, backend), backend) is State.FAILED
    assert store.get("job").error_message.startswith("The replica worker 0 exited with a non-zero status of 1.")
    assert len(backend.stopped) == 2  # the master and the evaluator, still running


def test_evaluators_get_their_grace_after_the_master_succeeds(settings, store):
    settings = replace(settings, evaluator_grace_seconds=3600)
    submitted(store, settings, training_input=WITH_WORKER_AND_EVALUATOR)
    backend = FakeBackend(script={"master-replica-0": [0]})
    driver = JobDriver("job", settings, store, backend)
    for _ in range(5):
        driver.step()
        backend.advance()
    assert driver.phase is Phase.ENDING and backend.replica("job", "evaluator-replica-0").status.value == "running"
    assert backend.replica("job", "worker-replica-0").status.value == "exited"  # stopped at once
    backend.exit("job", "evaluator-replica-0", 0)  # it scored the last checkpoint
    assert drive(driver, backend) is State.SUCCEEDED
    assert "waiting up to 3600 s for evaluator 0" in " ".join(service_lines(settings))


def test_a_cancel_ends_the_job_cancelled_whatever_the_exit_codes(settings, store):
    submitted(store, settings)
    backend = FakeBackend()
    driver = JobDriver("job", settings, store, backend)
    driver.step(), driver.step(), driver.step()
    assert store.get("job").state is State.RUNNING
    store.transition("job", State.CANCELLING, [State.RUNNING], error_message="Job cancelled by the user.")
    assert drive(driver, backend) is State.CANCELLED
    assert store.get("job").error_message == "Job cancelled by the user." and backend.stopped


def test_a_queued_job_waits_for_room_then_starts(settings, store):
    settings = replace(settings, max_running_replicas=1)
    submitted(store, settings, "ahead", cap=1)
    submitted(store, settings, "behind", cap=1)
    backend = FakeBackend(script={"master-replica-0": [0]})
    ahead, behind = (JobDriver(job_id, settings, store, backend) for job_id in ("ahead", "behind"))
    for _ in range(3):
        behind.step()
    assert behind.phase is Phase.ADMISSION and store.get("behind").state is State.QUEUED
    assert store.queue_position("behind")[1].startswith("Waiting for capacity")
    assert drive(ahead, backend) is State.SUCCEEDED
    assert drive(behind, backend) is State.SUCCEEDED


def test_past_max_wait_time_a_queued_job_is_cancelled(settings, store):
    settings = replace(settings, max_running_replicas=1)
    submitted(store, settings, "ahead", cap=1)
    created = utc_now() - timedelta(hours=1)
    job = Job(job_id="impatient", training_input=BASIC.model_copy(
        update={"scheduling": Scheduling(max_wait_time="1800s")}), create_time=created)
    submitted(store, settings, "impatient", training_input=job.training_input, cap=1, create_time=created)
    backend = FakeBackend()
    assert drive(JobDriver("impatient", settings, store, backend), backend) is State.CANCELLED
    assert store.get("impatient").error_message.startswith("Job cancelled: it waited longer than")


def test_past_max_running_time_a_running_job_is_cancelled(settings, store):
    training_input = BASIC.model_copy(update={"scheduling": Scheduling(max_running_time="60s")})
    submitted(store, settings, training_input=training_input)
    backend = FakeBackend()
    driver = JobDriver("job", settings, store, backend)
    driver.step(), driver.step()
    job = store.get("job")
    store.update_resource(job.job_id, job.model_copy(update={"start_time": utc_now() - timedelta(minutes=5)}))
    assert drive(driver, backend) is State.CANCELLED
    assert "maxRunningTime (60s)" in store.get("job").error_message


def test_a_launch_the_engine_refuses_fails_the_job_with_its_reason(settings, store):
    submitted(store, settings)
    backend = FakeBackend(fail={"launch": EnvironmentNotReady("Docker refused the job's replicas: no room.")})
    assert drive(JobDriver("job", settings, store, backend), backend) is State.FAILED
    assert store.get("job").error_message.startswith("Docker refused the job's replicas: no room.")


def test_a_launch_cut_by_a_dead_controller_is_redone_from_scratch(settings, store):
    """The launch-started marker: what the dead controller made goes before the launch is redone."""
    submitted(store, settings)
    backend = FakeBackend(script={"master-replica-0": [0]})
    settings.job_paths("job").launch_started.touch()  # the dead controller's half of a launch
    backend.launch(plan_of("job"))
    assert drive(JobDriver("job", settings, store, backend), backend) is State.SUCCEEDED
    assert [c[0] for c in backend.calls if c[0] in ("remove", "launch")][:3] == ["launch", "remove", "launch"]
    assert len(backend.launched) == 2


def test_a_job_recorded_but_never_queued_was_interrupted(settings, store):
    store.create(Job(job_id="job", training_input=BASIC))  # its submit died before asking for admission
    backend = FakeBackend()
    assert drive(JobDriver("job", settings, store, backend), backend) is State.FAILED
    assert store.get("job").error_message.startswith(INTERRUPTED)


def test_a_verdict_left_by_a_dead_controller_is_finished_as_decided(settings, store):
    submitted(store, settings)
    backend = FakeBackend()
    driver = JobDriver("job", settings, store, backend)
    driver.step(), driver.step()
    store.record_verdict("job", {"state": "SUCCEEDED", "error_message": None, "failed_task": None,
                                 "failed_trial": ""})
    assert drive(JobDriver("job", settings, store, backend), backend) is State.SUCCEEDED  # a new controller's
    assert service_lines(settings)[-1] == "Job completed successfully."


def test_a_job_that_already_ended_needs_no_step(settings, store):
    store.create(Job(job_id="job", training_input=BASIC))
    store.transition("job", State.SUCCEEDED, [State.QUEUED])
    backend = FakeBackend()
    driver = JobDriver("job", settings, store, backend)
    assert driver.step() is None and driver.final_state is None and backend.calls == []


def test_a_study_runs_its_trials_as_groups_of_the_same_driver(settings, store):
    training_input = TrainingInput.model_validate({
        **BASIC.model_dump(by_alias=True, exclude_none=True),
        "hyperparameters": {"goal": "MAXIMIZE", "hyperparameterMetricTag": "acc", "maxTrials": 3,
                            "maxParallelTrials": 2, "algorithm": "GRID_SEARCH",
                            "params": [{"parameterName": "n", "type": "INTEGER", "minValue": 1, "maxValue": 3}]}})
    submitted(store, settings, training_input=training_input)
    backend = FakeBackend(script={"1/master-replica-0": [137, 0], "2/master-replica-0": [1],
                                  "3/master-replica-0": [0]})
    assert drive(JobDriver("job", settings, store, backend), backend) is State.SUCCEEDED
    trials = {t.trial_id: t for t in store.get("job").training_output.trials}
    assert {k: t.state for k, t in trials.items()} == {"1": State.SUCCEEDED, "2": State.FAILED, "3": State.SUCCEEDED}
    assert sorted(t.hyperparameters["n"] for t in trials.values()) == ["1", "2", "3"]
    assert [plan.trial_id for plan in backend.launched] == ["1", "2", "3"] and len(backend.restarted) == 1
    assert sorted(trial for _, trial in backend.removed if trial) == ["1", "2", "3"] and not backend.replicas


def test_a_study_asking_more_trials_at_once_than_the_cap_runs_them_one_at_a_time(settings, store):
    """maxParallelTrials 4 where the cap holds one trial: admitted for one, the study starts one
    trial, the next as it ends, and runs all four to completion; the job keeps maxParallelTrials 4."""
    training_input = TrainingInput.model_validate({
        **BASIC.model_dump(by_alias=True, exclude_none=True),
        "hyperparameters": {"goal": "MAXIMIZE", "hyperparameterMetricTag": "acc", "maxTrials": 4,
                            "maxParallelTrials": 4, "algorithm": "GRID_SEARCH",
                            "params": [{"parameterName": "n", "type": "INTEGER", "minValue": 1, "maxValue": 4}]}})
    submitted(store, settings, training_input=training_input, cap=1)
    assert store.held_replicas("job") == 1
    backend = FakeBackend(script={f"{n}/master-replica-0": [0] for n in range(1, 5)})
    launch, running_at_launch = backend.launch, []

    def counted_launch(plan):
        running_at_launch.append(sorted({r.trial_id for r in backend.replicas.values()
                                         if r.status is not ReplicaStatus.EXITED}))
        launch(plan)

    backend.launch = counted_launch  # type: ignore[method-assign]
    assert drive(JobDriver("job", settings, store, backend), backend) is State.SUCCEEDED
    job = store.get("job")
    assert [t.state for t in job.training_output.trials] == [State.SUCCEEDED] * 4
    assert [plan.trial_id for plan in backend.launched] == ["1", "2", "3", "4"]
    assert running_at_launch == [[], [], [], []]  # each trial starts once the one before it is gone
    assert job.training_input.hyperparameters.max_parallel_trials == 4  # the resource as the user sent it


def test_a_bounded_study_is_warned_of_once_at_submit_and_its_log_keeps_it(settings, store):
    """The submit's warning is kept in the job's log (stream-logs, the console, a REST client,
    which sees no submit warnings), and admission counts the trials that run at once."""
    from aiptrain.config import SubmitFlags
    from aiptrain.logs import JobLogWriter
    from aiptrain.submission import Submitter, prepare

    settings = replace(settings, max_running_replicas=2)
    base = Job.model_validate({"jobId": "job", "trainingInput": {
        "scaleTier": "BASIC", "region": "us-central1", "masterConfig": {"imageUri": "example.com/t:1"},
        "hyperparameters": {"goal": "MAXIMIZE", "hyperparameterMetricTag": "acc", "maxTrials": 6,
                            "maxParallelTrials": 3, "algorithm": "GRID_SEARCH",
                            "params": [{"parameterName": "n", "type": "INTEGER", "minValue": 1, "maxValue": 6}]}}})
    submission = prepare(SubmitFlags(job_id="job"), settings, base)
    warning = submission.trials_notice
    assert warning and warning.startswith("trainingInput.hyperparameters.maxParallelTrials [3]: this machine runs "
                                          "2 of the study's trials at once")
    assert [notice for notice in submission.notices if "maxParallelTrials" in notice] == [warning]
    job = store.create(submission.job)
    with JobLogWriter(settings.job_paths("job").log) as job_log:
        Submitter(settings, store, FakeBackend())._record(submission, job, "job", job_log)
    assert service_lines(settings).count(warning) == 1
    assert store.held_replicas("job") == 2
    assert store.get("job").training_input.hyperparameters.max_parallel_trials == 3
    remote = prepare(SubmitFlags(job_id="job"), settings, base, runs_here=False)  # the server's machine decides
    assert remote.trials_notice is None and not any("maxParallelTrials" in n for n in remote.notices)


def test_the_controller_leaves_a_job_its_submit_still_stages_alone(settings, store, monkeypatch):
    from aiptrain.ownership import JobLock
    from aiptrain.runner import controller as controller_module

    store.create(Job(job_id="job", training_input=BASIC))
    backend = FakeBackend()
    monkeypatch.setattr(controller_module, "open_backend", lambda s, name: backend)
    submit_lock = JobLock.try_acquire(settings.job_paths("job").lock)  # as submit holds it while staging
    controller = controller_module.Controller(settings, JobLock.try_acquire(settings.controller_lock_path))
    try:
        assert controller.adopt() is True  # left to its submit, which wakes the controller when done
        controller.pool.shutdown(wait=True)
    finally:
        submit_lock.release()
        controller.home_lock.release()
    assert "job" not in controller.drivers and not backend.launched


def test_the_controllers_sweep_is_told_the_homes_active_jobs(settings, store):
    """Networks the engine kept after a job ended go at the sweep, those of active jobs never."""
    from aiptrain.ownership import JobLock
    from aiptrain.runner import controller as controller_module

    store.create(Job(job_id="running", training_input=BASIC))
    ended = store.create(Job(job_id="ended", training_input=BASIC))
    store.transition(ended.job_id, State.CANCELLED, [State.QUEUED])
    backend = FakeBackend()
    controller = controller_module.Controller(settings, JobLock.try_acquire(settings.controller_lock_path))
    try:
        controller.remove_abandoned(backend.installation)
    finally:
        controller.pool.shutdown(wait=True)
        controller.home_lock.release()
    assert backend.installation.calls == [("remove_abandoned", ["running"])]


@pytest.mark.parametrize("gcs_mode, tls, started", [
    ("local", True, True),  # gs:// kept here: the endpoint starts while the submit stages
    ("local", False, True),  # a new home's: the backend makes the endpoint's TLS files first
    ("remote", True, False),  # Cloud Storage itself: no endpoint
])
def test_a_submit_starts_the_storage_endpoint_beside_its_packaging(settings, store, tmp_path, gcs_mode, tls, started):
    from aiptrain.config import SubmitFlags
    from aiptrain.storage.endpoint import TLS_DIR_NAME, TLS_FILES
    from aiptrain.submission import Submitter, prepare

    settings = replace(settings, gcs_mode=gcs_mode)
    if tls:
        (settings.home / TLS_DIR_NAME).mkdir()
        for name in TLS_FILES:
            (settings.home / TLS_DIR_NAME / name).write_text("made\n")
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text("")
    flags = SubmitFlags(job_id="job", package_path=str(tmp_path / "trainer"), module_name="trainer.task", region="us-central1",
                        runtime_version="minimal", job_dir="gs://bucket/out")
    backend = FakeBackend()
    Submitter(settings, store, backend)._get_ready(prepare(flags, settings))
    calls = backend.installation.calls_to("ensure_storage_endpoint")
    assert len(calls) == (1 if started else 0)
    assert (settings.home / TLS_DIR_NAME / "trust.pem").is_file() is (started or tls)


def test_a_controller_starting_sets_a_large_log_aside(settings, monkeypatch):
    from aiptrain.runner import control

    monkeypatch.setattr(control, "LOG_KEEP_BYTES", 10)
    log_path = settings.controller_log_path
    log_path.write_text("an old controller's lines\n")
    control.keep_log_small(log_path)
    assert not log_path.exists() and log_path.with_name("controller.log.1").read_text().startswith("an old")
    log_path.write_text("small\n")
    control.keep_log_small(log_path)  # small: stays
    assert log_path.read_text() == "small\n"


def test_a_trial_whose_replicas_all_exist_but_never_started_is_started_in_place(settings, store):
    """A controller killed between creating a trial's replica and starting it may have sent the
    start already: the engine can start the replica after the next controller looked. Replacing
    it would run the trial twice (the chaos suite saw runs 1 2 2 3 4 5 6); every replica exists,
    so those not started are started, which the engine does once."""
    training_input = TrainingInput.model_validate({
        **BASIC.model_dump(by_alias=True, exclude_none=True),
        "hyperparameters": {"goal": "MAXIMIZE", "hyperparameterMetricTag": "acc", "maxTrials": 1,
                            "algorithm": "GRID_SEARCH",
                            "params": [{"parameterName": "n", "type": "INTEGER", "minValue": 1, "maxValue": 2}]}})
    submitted(store, settings, training_input=training_input)
    backend = FakeBackend(script={"1/master-replica-0": [0]})
    killed = JobDriver("job", settings, store, backend)
    while not backend.launched:
        killed.step()
    replica = backend.replica("job", "master-replica-0", "1")  # created, its start not seen yet
    replica.status, replica.runs = ReplicaStatus.CREATED, 0
    settings.job_paths("job").launched("1").unlink()
    assert drive(JobDriver("job", settings, store, backend), backend) is State.SUCCEEDED
    assert [plan.trial_id for plan in backend.launched] == ["1"]
    assert backend.restarted == [replica.container_id]
    assert "Trial 1 was not started when its controller stopped: starting it." in service_lines(settings)


def test_a_controller_whose_home_was_deleted_removes_what_its_jobs_shared(settings, store, monkeypatch):
    """The home's lone replicas' network and storage endpoint would otherwise stay on the
    engine for good, each network holding a subnet of the pool."""
    import shutil

    from aiptrain.ownership import JobLock
    from aiptrain.runner import controller as controller_module

    backend = FakeBackend()
    monkeypatch.setattr(controller_module, "open_backend", lambda s, name: backend)
    controller = controller_module.Controller(settings, JobLock.try_acquire(settings.controller_lock_path))
    controller.backend("docker")  # opened by a job it drove
    store.close()
    shutil.rmtree(settings.home)
    controller.run()  # sees the home gone and stops
    calls = backend.installation.calls
    assert ("remove_installation",) in calls and ("release_shared",) not in calls



def test_the_controller_gets_relative_paths_of_its_starting_command_made_absolute(tmp_path):
    """It runs in "/": a relative GOOGLE_APPLICATION_CREDENTIALS meant the submit's directory."""
    from aiptrain.runner.control import controller_environment

    env = controller_environment({"GOOGLE_APPLICATION_CREDENTIALS": "keys/sa.json", "CLOUDSDK_CONFIG": "/etc/gcloud",
                                  "AIPTRAIN_SWARM_SHARED_DIRS": "data:/srv/shared", "DOCKER_CERT_PATH": "",
                                  "TERM": "xterm"}, "/work/project", tmp_path)
    assert env == {"GOOGLE_APPLICATION_CREDENTIALS": "/work/project/keys/sa.json", "CLOUDSDK_CONFIG": "/etc/gcloud",
                   "AIPTRAIN_SWARM_SHARED_DIRS": "/work/project/data:/srv/shared", "DOCKER_CERT_PATH": "",
                   "TERM": "xterm", "AIPTRAIN_HOME": str(tmp_path)}

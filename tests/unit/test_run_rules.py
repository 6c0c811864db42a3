"""lifecycle.RunRules: a job's own rules where its dialect's differ from AI Platform's (Vertex
AI's scheduling): its restart budget, every replica restarted with the one that was, and limits
that fail the job instead of cancelling it. The rule table-tested, then stepped by the driver
against the fake backend."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from aiptrain.admission import request
from aiptrain.backends import ReplicaStatus
from aiptrain.lifecycle import Decision, RunRules, decide
from aiptrain.model import Job, Scheduling, State, utc_now
from aiptrain.planning import PlanInputs, inputs_from_dict, inputs_to_dict, save_plan_inputs
from aiptrain.runner.driver import JobDriver

from fakes import FakeBackend
from test_driver import WITH_WORKER_AND_EVALUATOR, drive, service_lines, settings, store  # noqa: F401 - fixtures
from test_lifecycle import TASKS, obs, running

KILLED = obs("worker-replica-0", ReplicaStatus.EXITED, 137)
CASES = [
    ("alone: only the killed replica", False, running(KILLED), {}, Decision(restart=("worker-replica-0",))),
    ("together: the others with it", True, running(KILLED), {},
     Decision(restart=("worker-replica-0",),
              restart_alongside=("master-replica-0", "worker-replica-1", "ps-replica-0"))),
    ("together, two killed", True, running(KILLED, obs("ps-replica-0", ReplicaStatus.EXITED, 143)), {},
     Decision(restart=("worker-replica-0", "ps-replica-0"), restart_alongside=("master-replica-0", "worker-replica-1"))),
    ("together, over budget: the job fails", True, running(KILLED), {"worker-replica-0": 5},
     Decision(State.FAILED, "The replica worker 0 exited with a non-zero status of 137. It had been restarted 5 "
              "times already.", "worker-replica-0")),
    ("together, nothing killed: nothing restarts", True, running(), {}, Decision()),
]


@pytest.mark.parametrize("together, observations, restarts, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide_restarts_alone_or_together(together, observations, restarts, expected):
    assert decide(TASKS, observations, restarts, max_restarts=5, restart_together=together) == expected


@pytest.mark.parametrize("rules, default, budget", [
    (RunRules(), 5, 5), (RunRules(max_restarts=0), 5, 0), (RunRules(max_restarts=2), 5, 2)])
def test_the_restart_budget(rules, default, budget):
    assert rules.restart_budget(default) == budget


def test_rules_travel_with_the_plan_inputs():
    inputs = PlanInputs(runtime_image=None, rules=RunRules(max_restarts=0, restart_together=True, limits_fail=True))
    assert inputs_from_dict(inputs_to_dict(inputs)).rules == inputs.rules
    assert inputs_from_dict(inputs_to_dict(PlanInputs(runtime_image=None))).rules is None


# -- stepped by the driver ------------------------------------------------------------------------


def submitted_with(store, settings, rules: RunRules | None, training_input=WITH_WORKER_AND_EVALUATOR,  # noqa: F811
                   cap: int | None = None, **fields) -> None:
    job = store.create(Job(job_id="job", training_input=training_input, **fields))
    save_plan_inputs(settings.job_paths("job").plan_inputs, PlanInputs(runtime_image="aiptrain/runtime:minimal", rules=rules))
    request(store, "job", job, cap)


def test_a_killed_worker_restarts_every_replica_when_the_job_asks(settings, store):  # noqa: F811
    submitted_with(store, settings, RunRules(restart_together=True))
    backend = FakeBackend(script={"worker-replica-0": [137], "master-replica-0": [None, 0]})
    assert drive(JobDriver("job", settings, store, backend), backend) is State.SUCCEEDED
    # The killed worker, then the master and the evaluator, which still ran: stopped first.
    killed, *others = backend.restarted
    assert len(set(backend.restarted)) == 3 and set(backend.calls_to("stop")[0][1]) == set(others)
    assert store.restarts("job") == {"worker-replica-0": 1}  # only the killed one spends its budget
    lines = service_lines(settings)
    assert any("Restarting master 0, evaluator 0 with it: this job restarts all its replicas" in line
               for line in lines)


def test_alone_by_default_only_the_killed_replica_restarts(settings, store):  # noqa: F811
    submitted_with(store, settings, None)
    backend = FakeBackend(script={"worker-replica-0": [137]})

    def master_done(step: int) -> None:
        if step == 10:
            backend.exit("job", "master-replica-0", 0)

    assert drive(JobDriver("job", settings, store, backend), backend, master_done) is State.SUCCEEDED
    assert len(backend.restarted) == 1 and "with it" not in " ".join(service_lines(settings))


def test_a_budget_of_none_fails_at_the_first_kill(settings, store):  # noqa: F811
    submitted_with(store, settings, RunRules(max_restarts=0))
    backend = FakeBackend(script={"worker-replica-0": [137]})
    assert drive(JobDriver("job", settings, store, backend), backend) is State.FAILED
    assert not backend.restarted
    assert store.get("job").error_message.startswith("The replica worker 0 exited with a non-zero status of 137.")


def test_past_its_running_time_a_job_whose_limits_fail_fails(settings, store):  # noqa: F811
    limited = WITH_WORKER_AND_EVALUATOR.model_copy(update={"scheduling": Scheduling(max_running_time="60s")})
    submitted_with(store, settings, RunRules(limits_fail=True), training_input=limited)
    backend = FakeBackend()
    driver = JobDriver("job", settings, store, backend)
    driver.step(), driver.step()
    job = store.get("job")
    store.update_resource(job.job_id, job.model_copy(update={"start_time": utc_now() - timedelta(minutes=5)}))
    assert drive(driver, backend) is State.FAILED
    job = store.get("job")
    assert job.error_message.startswith(
        "The job ran longer than scheduling.maxRunningTime (60s): its replicas were stopped.")
    assert len(backend.stopped) == 3 and not backend.replicas
    assert "The job ran longer than scheduling.maxRunningTime (60s): its replicas were stopped." in service_lines(
        settings)


def test_past_its_wait_a_queued_job_whose_limits_fail_fails(settings, store):  # noqa: F811
    settings = replace(settings, max_running_replicas=1)
    ahead = store.create(Job(job_id="ahead", training_input=WITH_WORKER_AND_EVALUATOR))
    save_plan_inputs(settings.job_paths("ahead").plan_inputs, PlanInputs(runtime_image=None))
    request(store, "ahead", ahead, 1)
    created = utc_now() - timedelta(hours=1)
    waiting = WITH_WORKER_AND_EVALUATOR.model_copy(update={"scheduling": Scheduling(max_wait_time="1800s")})
    submitted_with(store, settings, RunRules(limits_fail=True), training_input=waiting, create_time=created, cap=1)
    backend = FakeBackend()
    assert drive(JobDriver("job", settings, store, backend), backend) is State.FAILED
    assert store.get("job").error_message.startswith("The job did not start within scheduling.maxWaitTime (1800s).")
    assert not backend.launched

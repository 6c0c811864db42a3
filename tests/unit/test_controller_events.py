"""The controller's chores (aiptrain.runner.events) on a fake clock: when each runs, what it does
with what is in hand, and that its failure stays its own. No engine, no waits: the clock only
moves when a test moves it."""

from __future__ import annotations

import logging
import math

import pytest

from aiptrain.model import Job
from aiptrain.ownership import JobLock
from aiptrain.runner import controller as controller_module
from aiptrain.runner.controller import (
    ADOPT_EVERY_SECONDS,
    COMMAND_SERVER_QUIET_SECONDS,
    PRUNE_EVERY_SECONDS,
    Controller,
)
from aiptrain.runner.events import PeriodicEvent, run_all, seconds_to_next
from aiptrain.settings import Settings
from aiptrain.store import JobStore

from fakes import FakeBackend


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def settings(tmp_path) -> Settings:
    settings = Settings(home=tmp_path / "home", controller_idle_seconds=60)
    settings.ensure_dirs()
    return settings


@pytest.fixture
def controller(settings, monkeypatch):
    """A controller on a fake clock that serves commands and exits idle, its backend a fake."""
    backend = FakeBackend()
    monkeypatch.setattr(controller_module, "open_backend", lambda s, name: backend)
    started = []
    monkeypatch.setattr(controller_module, "start_command_server", started.append)
    controller = Controller(settings, JobLock.try_acquire(settings.controller_lock_path),
                            idle_exit=True, serves_commands=True, clock=FakeClock())
    controller.command_servers_started = started
    yield controller
    controller.pool.shutdown(wait=True)
    controller.home_lock.release()


# -- the event ------------------------------------------------------------------------------------

@pytest.mark.parametrize("interval, looks, runs", [
    (10, [0, 5, 10, 15, 21, 30, 31], [0, 10, 21, 31]),  # first at the first look, then each interval after the last run
    (10, [100], [100]),
    (0, [0, 0.5, 0.5, 7], [0, 0.5, 0.5, 7]),  # every wake
    (3600, [0, 1, 3599.9, 3600], [0, 3600]),
])
def test_an_event_runs_at_its_first_look_then_once_per_interval(interval, looks, runs):
    ran = []
    event = PeriodicEvent("chore", interval, ran.append)
    run_all([event], looks[0])
    for now in looks[1:]:
        run_all([event], now)
    assert ran == runs


def test_an_event_asked_for_runs_at_once_however_recently_it_ran():
    ran = []
    asked = [False]
    event = PeriodicEvent("adoption", 1.0, ran.append, asked=lambda: asked[0])
    for now, ask in [(0, False), (0.2, False), (0.3, True), (0.4, False), (1.3, False)]:
        asked[0] = ask
        event.run(now)
    assert ran == [0, 0.3, 1.3]


def test_a_failing_event_is_logged_and_runs_again_only_when_due(caplog):
    ran = []

    def action(now):
        ran.append(now)
        if now < 20:
            raise OSError("the disk is full")

    event = PeriodicEvent("pruning", 10, action)
    with caplog.at_level(logging.WARNING, logger="aiptrain.controller"):
        for now in [0, 1, 10, 11, 20, 25]:
            event.run(now)  # never raises
    assert ran == [0, 10, 20]
    failures = [r for r in caplog.records if "pruning" in r.getMessage()]
    # The first failure with its traceback, the same one again as one line, then nothing once it ran well.
    assert [(r.exc_info is not None, "failed again" in r.getMessage()) for r in failures] == [(True, False), (False, True)]
    assert event.last_failure == ""


def test_one_failing_event_leaves_the_others_to_run():
    ran = []

    def broken(now):
        raise RuntimeError("the store is locked")

    run_all([PeriodicEvent("adoption", 1, broken), PeriodicEvent("pruning", 3600, ran.append)], 5.0)
    assert ran == [5.0]


@pytest.mark.parametrize("intervals, last_runs, now, expected", [
    ([1.0], [10.0], 10.25, 0.75),
    ([1.0, 3600.0], [10.0, 10.0], 10.5, 0.5),
    ([1.0], [10.0], 12.0, 0.0),  # overdue: no sleep
    ([0.0], [10.0], 10.0, math.inf),  # runs at every wake: sets no wake of its own
    ([], [], 10.0, math.inf),
])
def test_the_loop_sleeps_until_the_next_due_event(intervals, last_runs, now, expected):
    events = [PeriodicEvent("chore", interval, lambda now: None) for interval in intervals]
    for event, last in zip(events, last_runs, strict=True):
        event.run(last)
    assert seconds_to_next(events, now) == expected


def test_a_retired_event_never_runs_again_nor_wakes_the_loop():
    ran = []
    event = PeriodicEvent("command server", 0, ran.append, asked=lambda: True)
    event.run(0)
    event.retire()
    event.run(1)
    assert ran == [0] and event.seconds_to_next(1) == math.inf


# -- the controller's chores ----------------------------------------------------------------------

def test_the_controller_adopts_every_second_and_at_each_command_and_prunes_hourly(controller, monkeypatch):
    adopted, pruned = [], []
    monkeypatch.setattr(controller, "adopt", lambda: adopted.append(controller.clock()) or False)
    monkeypatch.setattr(controller.pruning, "action", pruned.append)
    start = controller.clock.now
    for offset, news in [(0, False), (0.5, False), (0.6, True), (1.0, False), (1.6, False),
                         (PRUNE_EVERY_SECONDS - 0.1, False), (PRUNE_EVERY_SECONDS, False)]:
        controller.clock.now = start + offset
        if news:
            controller.news.set()
        run_all(controller.before_steps, controller.clock())
    # 0.5 too soon, 0.6 asked by a command, 1.0 within a second of that, and an hour on adopted just before.
    assert [t - start for t in adopted] == pytest.approx([0, 0.6, 1.6, PRUNE_EVERY_SECONDS - 0.1])
    assert [t - start for t in pruned] == pytest.approx([0, PRUNE_EVERY_SECONDS])
    assert not controller.news.is_set()


def test_the_controller_wakes_for_adoption_at_least_every_second(controller):
    now = controller.clock()
    run_all(controller.before_steps, now)
    assert controller.seconds_to_next(now + 0.25) == ADOPT_EVERY_SECONDS - 0.25
    controller.due["job"] = now + 0.5
    assert controller.seconds_to_next(now + 0.25) == 0.25


def test_a_failing_adoption_does_not_stop_the_controller(controller, monkeypatch, caplog):
    def broken():
        raise RuntimeError("database is locked")

    monkeypatch.setattr(controller, "adopt", broken)
    with caplog.at_level(logging.ERROR, logger="aiptrain.controller"):
        run_all(controller.before_steps, controller.clock())
    assert "adoption failed" in caplog.text and not controller.stopping.is_set()


@pytest.mark.parametrize("submits_waiting, in_flight, had_work, quiet_for, starts", [
    (True, False, False, 5.0, False),  # a submit still stages its job: its imports come first
    (False, True, True, 5.0, False),  # a step in flight (a launch)
    (False, False, False, COMMAND_SERVER_QUIET_SECONDS - 0.1, False),  # no job yet: a second of quiet first
    (False, False, False, COMMAND_SERVER_QUIET_SECONDS, True),
    (False, False, True, 0.0, True),  # the first job is out of hand: at once
])
def test_the_command_server_starts_once_nothing_is_in_hand(controller, submits_waiting, in_flight, had_work,
                                                          quiet_for, starts):
    controller.submits_waiting = submits_waiting
    controller.had_work = had_work
    if in_flight:
        controller.in_flight["job"] = None
    controller.clock.now = controller.last_busy + quiet_for
    run_all([controller.command_server], controller.clock())
    assert controller.command_servers_started == ([controller.settings.home] if starts else [])
    run_all([controller.command_server], controller.clock() + 10)  # once, whatever comes after
    assert len(controller.command_servers_started) <= 1


def test_a_command_server_that_fails_to_start_is_not_tried_again(controller, monkeypatch):
    tries = []

    def fails(home):
        tries.append(home)
        raise OSError("no more processes")

    monkeypatch.setattr(controller_module, "start_command_server", fails)
    controller.had_work = True
    for offset in (0, 1, 2):
        run_all(controller.after_steps, controller.clock() + offset)
    assert len(tries) == 1 and not controller.stopping.is_set()


@pytest.mark.parametrize("quiet_for, driving, job_after_letting_go, stops", [
    (59.9, False, False, False),
    (60.0, False, False, True),
    (600.0, True, False, False),  # a job in hand: never idle
    (60.0, False, True, False),  # a job recorded meanwhile: the home's lock taken back, driven
])
def test_the_controller_exits_after_its_idle_seconds_with_nothing_active(controller, settings, quiet_for, driving,
                                                                      job_after_letting_go, stops):
    if driving:
        controller.drivers["job"] = None
    if job_after_letting_go:
        JobStore(settings.store).create(Job(job_id="late"))
    controller.clock.now = controller.quiet_since + quiet_for
    run_all([controller.idle], controller.clock())
    assert controller.stopping.is_set() is stops
    other = JobLock.try_acquire(settings.controller_lock_path)
    assert (other is None) is not stops  # the home's lock let go of, or held (taken back)
    if other is not None:
        other.release()
    if driving:
        assert controller.quiet_since == controller.clock()  # the quiet starts over


def test_a_controller_that_cannot_look_after_letting_go_of_the_home_stops(controller, settings, monkeypatch):
    """The home's lock is let go of before the last look: a controller must not drive on without it."""
    def broken():
        raise RuntimeError("database is locked")

    monkeypatch.setattr(controller, "drivable_job_ids", broken)
    controller.clock.now = controller.quiet_since + settings.controller_idle_seconds
    run_all([controller.idle], controller.clock())
    assert controller.stopping.is_set()
    other = JobLock.try_acquire(settings.controller_lock_path)
    assert other is not None  # let go of
    other.release()


def test_a_controller_that_never_exits_idle_or_serves_commands_has_only_the_chores_that_feed_its_steps(settings):
    controller = Controller(settings, JobLock.try_acquire(settings.controller_lock_path), idle_exit=False)
    try:
        assert [e.name for e in controller.before_steps + controller.after_steps] == ["adoption", "pruning and sweep"]
    finally:
        controller.pool.shutdown(wait=True)
        controller.home_lock.release()

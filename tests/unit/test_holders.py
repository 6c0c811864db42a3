"""The pool of network holders (aiptrain.backends.holders) without an engine: what is lent, given
back, made for a burst, trimmed and removed. tests/engine/test_network_holders.py runs it on one."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from aiptrain.backends import holders as holders_module
from aiptrain.backends.holders import HOLDER_IDLE_SECONDS, HOLDERS_KEPT, HolderRecipe, Holders

RECIPE = HolderRecipe(images=("aiptrain/runtime:minimal",), user="65534:65534", network="aiptrain-solo", gateway="gw")


class FakeEngine:
    installation = "test"

    def __init__(self) -> None:
        self.removed: list[str] = []
        self.listed: list[dict] = []  # what api.containers() answers
        self.api = self

    def remove_containers(self, container_ids) -> None:
        self.removed += list(container_ids)

    def owner(self) -> list[str]:
        return ["aiptrain.installation=test"]

    def containers(self, all: bool, filters: dict) -> list[dict]:  # noqa: A002 - docker-py's signature
        return self.listed


def holder(container_id: str) -> dict:
    return {"Id": container_id, "Labels": {"aiptrain.role": "network-holder"}}


def replica_in(holder_id: str) -> dict:
    return {"Id": f"replica-of-{holder_id}", "Labels": {}, "HostConfig": {"NetworkMode": f"container:{holder_id}"}}


@pytest.fixture
def pool(monkeypatch) -> Holders:
    made = (f"holder-{n}" for n in itertools.count(1))
    monkeypatch.setattr(Holders, "_start", lambda self, recipe: next(made))
    now = [1000.0]
    pool = Holders(FakeEngine(), clock=lambda: now[0])  # type: ignore[arg-type]
    pool.now = now  # type: ignore[attr-defined]
    pool.keep()
    return pool


def settle(pool: Holders) -> None:
    deadline = time.monotonic() + 5
    while (pool._making or pool._timer) and time.monotonic() < deadline:
        time.sleep(0.01)


def ready_ids(pool: Holders) -> list[str]:
    return [h.container_id for h in pool._ready]


def test_one_is_kept_ready_and_a_lent_holder_goes_back_to_the_pool_for_the_next_replica(pool):
    pool.keep_ready(RECIPE, 0.0)
    settle(pool)
    assert ready_ids(pool) == ["holder-1"]
    assert pool.take("gw") == "holder-1"
    pool.let_go_of("holder-1")
    pool.give_back({"holder-1"})
    assert ready_ids(pool) == ["holder-1"] and pool.engine.removed == []
    assert pool.take("gw") == "holder-1"


def test_a_burst_that_finds_the_pool_empty_grows_it_by_one_holder_per_launch_that_missed(pool):
    assert [pool.take("gw") for _ in range(3)] == [None, None, None]
    pool.keep_ready(RECIPE, 0.0)
    settle(pool)
    assert ready_ids(pool) == ["holder-1", "holder-2", "holder-3"]
    pool.keep_ready(RECIPE, 0.0)  # no launch missed since: nothing more is made
    settle(pool)
    assert len(pool._ready) == 3


def test_holders_beyond_the_pools_size_and_those_it_did_not_lend_are_removed(pool, monkeypatch):
    monkeypatch.setattr(holders_module, "HOLDER_IDLE_SECONDS", 3600.0)
    lent = [f"lent-{n}" for n in range(HOLDERS_KEPT + 2)]
    pool._lent.update(dict.fromkeys(lent, "gw"))
    pool.give_back({*lent, "from-an-earlier-controller"})
    settle(pool)
    deadline = time.monotonic() + 5
    while len(pool.engine.removed) < 3 and time.monotonic() < deadline:  # removed in a thread
        time.sleep(0.01)
    assert len(pool._ready) == HOLDERS_KEPT
    assert len(pool.engine.removed) == 3 and "from-an-earlier-controller" in pool.engine.removed
    pool.stop_keeping()


def test_holders_of_a_solo_network_made_again_go_at_the_next_take(pool):
    pool._lent["old"] = "old-gateway"
    pool.give_back({"old"})
    assert pool.take("gw") is None
    assert pool.engine.removed == ["old"]


def test_beyond_the_newest_holders_unused_for_a_while_are_trimmed(pool):
    pool._lent.update({"a": "gw", "b": "gw", "c": "gw"})
    pool.give_back({"a"})
    pool.now[0] += HOLDER_IDLE_SECONDS
    pool.give_back({"b"})
    pool.give_back({"c"})
    pool._trim()
    assert ready_ids(pool) == ["b", "c"] and pool.engine.removed == ["a"]
    pool.now[0] += HOLDER_IDLE_SECONDS
    pool._trim()
    assert ready_ids(pool) == ["c"]
    pool.stop_keeping()


def test_when_the_controller_lets_go_the_pool_goes_and_nothing_comes_back_to_it(pool):
    pool._lent.update({"a": "gw", "b": "gw"})
    pool.give_back({"a"})
    pool.stop_keeping()
    assert pool._ready == [] and pool.engine.removed == ["a"]
    pool.give_back({"b"})
    deadline = time.monotonic() + 5
    while "b" not in pool.engine.removed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool._ready == [] and "b" in pool.engine.removed


def test_the_sweep_removes_a_lent_holder_whose_replica_went_without_a_teardown_and_keeps_the_rest(pool):
    """A replica removed by hand (`docker rm -f`) never gives its holder back: the sweep removes it;
    a holder in use, one in the pool and one just taken stay."""
    pool._lent.update({"orphaned": "gw", "in-use": "gw"})
    pool._ready.append(holders_module.ReadyHolder("pooled", "gw", 0.0))
    pool._in_hand.add("just-taken")
    pool.engine.listed = [holder("orphaned"), holder("in-use"), replica_in("in-use"), holder("pooled"),
                          holder("just-taken")]
    pool.remove_idle()
    assert pool.engine.removed == ["orphaned"] and "orphaned" not in pool._lent and "in-use" in pool._lent


def test_a_make_that_finds_nothing_wanted_leaves_the_next_one_free_to_be_scheduled(pool):
    """A timer that fires when the pool needs nothing more (a holder came back meanwhile) must not
    stay on record as still due: every later keep_ready would wait for it, and none would come."""
    pool._lent["a"] = "gw"
    pool.give_back({"a"})
    pool._recipe = RECIPE
    pool._timer = (threading.Timer(0, lambda: None), time.monotonic())  # this make's own timer, fired
    pool._make()
    assert pool._timer is None
    assert pool.take("gw") == "a" and pool.take("gw") is None  # a launch missed: one is wanted again
    pool.keep_ready(RECIPE, 0.0)
    settle(pool)
    assert ready_ids(pool) == ["holder-1"]

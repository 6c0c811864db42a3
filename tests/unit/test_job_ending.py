"""How a job ends when controllers die or the engine keeps a network: one closing line, kept by a
successor."""


import pytest

from conftest import drive_to_end
from fakes import FakeBackend
from test_engine_limits import custom_job


@pytest.mark.parametrize(
    "closing, state, error",
    [
        (["Job completed successfully."], "SUCCEEDED", None),
        ([("The replica worker 1 exited with a non-zero status of 1.", "ERROR"),
          "Finished tearing down training program.", "Job failed."], "FAILED",
         "The replica worker 1 exited with a non-zero status of 1."),
    ],
)
def test_a_successor_keeps_the_word_of_a_controller_killed_after_its_closing_line(tmp_path, closing, state, error):
    """Killed (kill -9) between its closing line and recording the state, a controller leaves the
    job RUNNING with its replicas removed and its decision in the store (kept before teardown);
    the next one records that decision, and says nothing again."""
    from aiptrain.logs import JobLogWriter, read_records
    from aiptrain.model import State
    from aiptrain.runner.driver import JobDriver
    from aiptrain.settings import Settings
    from aiptrain.store import JobStore

    settings = Settings(home=tmp_path)
    settings.ensure_dirs()
    store = JobStore(settings.store_path)
    store.create(custom_job("ended"))
    store.transition("ended", State.PREPARING, [State.QUEUED])
    store.transition("ended", State.RUNNING, [State.PREPARING])
    with JobLogWriter(settings.job_paths("ended").log) as log:
        log.service("Waiting for training program to start.")
        for line in closing:
            log.service(*(line if isinstance(line, tuple) else (line,)))
    store.record_verdict("ended", {"state": state, "error_message": error, "failed_task": None, "failed_trial": ""})
    before = read_records(settings.job_paths("ended").log)[0]

    backend = FakeBackend()  # the job's replicas are gone
    assert drive_to_end(JobDriver("ended", settings, store, backend)) is State[state]
    job = store.get("ended")
    assert job.state is State[state]
    assert (job.error_message or "").startswith(error or "") and (error is None) == (job.error_message is None)
    assert read_records(settings.job_paths("ended").log)[0] == before and backend.removed == [("ended", None)]


def test_a_network_the_engine_keeps_does_not_change_how_the_job_ended(tmp_path):
    from aiptrain.logs import read_records
    from aiptrain.model import State
    from aiptrain.runner.driver import JobDriver
    from aiptrain.settings import Settings
    from aiptrain.store import JobStore

    settings = Settings(home=tmp_path)
    settings.ensure_dirs()
    store = JobStore(settings.store_path)
    store.create(custom_job("kept"))
    store.transition("kept", State.PREPARING, [State.QUEUED])
    store.transition("kept", State.RUNNING, [State.PREPARING])
    store.record_verdict("kept", {"state": "SUCCEEDED", "error_message": None, "failed_task": None, "failed_trial": ""})

    from aiptrain.errors import AiptrainError

    # An engine that keeps the job's network (a stale endpoint) after its replicas went.
    stuck = FakeBackend(fail={"remove": AiptrainError(
        "Docker keeps the job's network 0123456789ab although its replicas are gone.")})
    assert drive_to_end(JobDriver("kept", settings, store, stuck)) is State.SUCCEEDED
    assert store.get("kept").state is State.SUCCEEDED
    lines = [(r.severity, r.message) for r in read_records(settings.job_paths("kept").log)[0]]
    assert lines[-2:] == [("WARNING", "Tearing down left something behind: Docker keeps the job's network "
                                      "0123456789ab although its replicas are gone."),
                          ("INFO", "Job completed successfully.")]


class NetworkApi:
    """The engine's side of removing one job network, as scripted: `listed` is how many endpoints
    each look at the network lists (the last repeats); every removal is refused with `refusal`
    until `removable_after` removals."""

    def __init__(self, listed: list[int], refusal: str = "has active endpoints", removable_after: int | None = None):
        self.listed, self.refusal, self.removable_after = listed, refusal, removable_after
        self.removals = self.looks = 0
        self.disconnected: list[str] = []

    def remove_network(self, network_id):
        from docker.errors import APIError

        self.removals += 1
        if self.removable_after is not None and self.removals > self.removable_after:
            return
        raise APIError(f"error while removing network: network job id {network_id} {self.refusal}")

    def inspect_network(self, network_id):
        count = self.listed[min(self.looks, len(self.listed) - 1)]
        self.looks += 1
        return {"Containers": {f"ep-{i}": {} for i in range(count)}}

    def disconnect_container_from_network(self, endpoint, network_id, force=False):
        self.disconnected.append(endpoint)


@pytest.fixture
def quick_patience(monkeypatch):
    """Patience in tenths of a second (the rule, not the engine's timing, is what is tested)."""
    import time

    from aiptrain.backends import networks

    monkeypatch.setattr(networks, "STALE_COUNT_SECONDS", 0.3)
    monkeypatch.setattr(networks, "NETWORK_PATIENCE_SECONDS", 60)
    pause = time.sleep
    monkeypatch.setattr(time, "sleep", lambda seconds: pause(0.01))


def test_a_network_refused_with_no_endpoint_listed_is_kept_at_once_as_a_stale_count(quick_patience):
    """Docker 20.10 can count endpoints a network no longer has (replicas exiting together), for
    minutes to an hour or until dockerd restarts: the teardown says so within seconds, never
    waiting out its patience for endpoints that are still being released."""
    from aiptrain.backends.engine import Engine
    from aiptrain.backends.networks import Networks
    from aiptrain.errors import AiptrainError

    api = NetworkApi(listed=[0])
    with pytest.raises(AiptrainError, match="^Docker keeps the job's network 0123456789ab although nothing is on it any "
                                            r"more \(a stale count of its endpoints, .* restarting dockerd clears\)"):
        Networks(Engine(client=api)).remove("0123456789abcdef")
    assert api.disconnected == []


def test_endpoints_still_listed_are_disconnected_and_the_network_removed_once_they_go(quick_patience):
    from aiptrain.backends.engine import Engine
    from aiptrain.backends.networks import Networks

    api = NetworkApi(listed=[2, 1, 0], removable_after=3)
    Networks(Engine(client=api)).remove("0123456789abcdef")
    assert api.disconnected == ["ep-0", "ep-1", "ep-0"]


def test_a_swarm_network_in_use_by_tasks_elsewhere_is_waited_for_even_when_none_is_listed_here(quick_patience):
    """A swarm's overlay network lists only this node's endpoints: "in use" by tasks on other
    nodes that are shutting down is not a stale count, and is waited for."""
    from aiptrain.backends.engine import Engine
    from aiptrain.backends.networks import Networks

    api = NetworkApi(listed=[0], refusal="is in use by task abc", removable_after=20)
    Networks(Engine(client=api)).remove("0123456789abcdef")
    assert api.removals == 21

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
    with JobLogWriter(settings.job_log_path("ended")) as log:
        log.service("Waiting for training program to start.")
        for line in closing:
            log.service(*(line if isinstance(line, tuple) else (line,)))
    store.record_verdict("ended", {"state": state, "error_message": error, "failed_task": None, "failed_trial": ""})
    before = read_records(settings.job_log_path("ended"))[0]

    backend = FakeBackend()  # the job's replicas are gone
    assert drive_to_end(JobDriver("ended", settings, store, backend)) is State[state]
    job = store.get("ended")
    assert job.state is State[state]
    assert (job.error_message or "").startswith(error or "") and (error is None) == (job.error_message is None)
    assert read_records(settings.job_log_path("ended"))[0] == before and backend.removed == [("ended", None)]


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
    lines = [(r.severity, r.message) for r in read_records(settings.job_log_path("kept"))[0]]
    assert lines[-2:] == [("WARNING", "Tearing down left something behind: Docker keeps the job's network "
                                      "0123456789ab although its replicas are gone."),
                          ("INFO", "Job completed successfully.")]

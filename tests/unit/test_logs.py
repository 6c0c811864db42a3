"""Log records, severities and gcloud's line format."""

import json
import threading
from dataclasses import asdict

import pytest

from aiptrain.backends import LogChunk
from aiptrain.logs import (
    CLOSING_POLL_SECONDS,
    JobLogWriter,
    LogRecord,
    follow,
    follow_blocks,
    format_lines,
    format_record,
    last_times_by_task,
    read_records,
    record_line,
    records_of,
    records_of_task,
    severity_of,
)
from aiptrain.runner.logcopy import DRAIN_PATIENCE_SECONDS, Drain, LogFollowers

from fakes import FakeBackend, plan_of


@pytest.mark.parametrize(
    "stream, text, severity",
    [
        ("stdout", "ERROR: printed", "INFO"),
        ("stderr", "Traceback (most recent call last):", "ERROR"),
        ("stderr", "WARNING:root:careful", "WARNING"),
        ("stderr", "INFO:tensorflow:step 1", "INFO"),
        ("stderr", "W1121 19:51:03.123 absl warning", "WARNING"),
        ("stderr", "2026-11-21 19:51:03.123456: I tensorflow/core/x.cc:1] oneDNN", "INFO"),
    ],
)
def test_severity(stream, text, severity):
    assert severity_of(stream, text) == severity


def test_gcloud_format_splits_multiline_messages():
    record = LogRecord("2026-11-21T19:51:03.123456789Z", "worker-replica-1", "ERROR", "line one\nline two")
    lines = format_record(record)
    assert len(lines) == 2
    severity, stamp, task, trial, message = lines[1].split("\t")
    assert (severity, task, trial, message) == ("ERROR", "worker-replica-1", "", "line two")
    assert len(stamp) == len("2026-11-21 19:51:03 +0000")
    assert len(format_record(record, allow_multiline=True)) == 1


def test_follow_reads_everything_written_before_done(tmp_path):
    path = tmp_path / "job.jsonl"
    writer = JobLogWriter(path)
    done = threading.Event()

    def produce():
        for i in range(500):
            writer.write("master-replica-0", "INFO", f"line {i}")
        done.set()

    threading.Thread(target=produce).start()
    messages = [r.message for batch in follow(path, done.is_set, poll_seconds=0.01) for r in batch]
    assert messages == [f"line {i}" for i in range(500)]
    assert len(read_records(path)[0]) == 500


# -- the fast paths: same lines as the records' slow path ------------------------------------

RECORDS = [
    LogRecord("2026-11-21T19:51:03.123456789Z", "master-replica-0", "INFO", "plain line"),
    LogRecord("2026-11-21T19:51:03.9Z", "worker-replica-1", "ERROR", "Traceback (most recent call last):"),
    LogRecord("2026-11-21T19:51:04Z", "worker-replica-1", "WARNING", "WARNING:root:careful", "3"),
    LogRecord("2026-11-21T19:51:04.5Z", "master-replica-0", "INFO", "ünïcödé ✓ 日本語 \U0001f680", "12"),
    LogRecord("2026-11-21T19:51:05.000001Z", "service", "ERROR", "first\nsecond\n\nfourth", "2"),
    LogRecord("2026-11-21T19:51:05.1Z", "master-replica-0", "INFO", 'quotes " and \\ backslash\ttab'),
    LogRecord("2026-11-21T19:51:06.2Z", "master-replica-0", "INFO", "\x1b[31mred\x1b[0m \r bell \x07 \x85 \u2028"),
    LogRecord("2026-11-21T19:51:07.3Z", "evaluator-replica-0", "CRITICAL", ""),
    LogRecord("2026-11-22T00:00:00.000000000Z", "ps-replica-2", "DEBUG", "a new day", "1"),
]


def slow_lines(records, allow_multiline=False, task=None) -> str:
    return "\n".join(line for r in records if task is None or r.task == task
                     for line in format_record(r, allow_multiline))


def written(records) -> bytes:
    return b"".join(record_line(r.time, r.task, r.severity, r.message, r.trial).encode() for r in records)


def test_record_lines_are_what_json_dumps_wrote():
    for record in RECORDS:
        assert record_line(record.time, record.task, record.severity, record.message, record.trial) == \
            json.dumps(asdict(record)) + "\n"


@pytest.mark.parametrize("allow_multiline", [False, True])
@pytest.mark.parametrize("task", [None, "master-replica-0", "service", "no-such-task"])
def test_format_lines_prints_what_format_record_prints(allow_multiline, task):
    assert format_lines(written(RECORDS), allow_multiline, task) == slow_lines(RECORDS, allow_multiline, task)
    assert records_of(written(RECORDS), task) == [r for r in RECORDS if task is None or r.task == task]


def test_older_logs_still_read():
    """Lines without a trial field, and blank lines, as older versions may have left them."""
    old = b'{"time": "2026-11-21T19:51:03.1Z", "task": "master-replica-0", "severity": "INFO", "message": "old"}\n'
    data = old + b"\n  \n" + written(RECORDS[:2])
    records = [LogRecord("2026-11-21T19:51:03.1Z", "master-replica-0", "INFO", "old"), *RECORDS[:2]]
    assert format_lines(data) == slow_lines(records)
    assert records_of(data) == records


def test_a_broken_line_is_an_error_as_before():
    with pytest.raises(ValueError):
        format_lines(written(RECORDS[:1]) + b"{not json\n")


def test_task_records_and_resume_times_skip_a_line_being_written(tmp_path):
    path = tmp_path / "job.jsonl"
    path.write_bytes(written(RECORDS) + written(RECORDS[:1])[:40])
    assert records_of_task(path, "master-replica-0") == [r for r in RECORDS if r.task == "master-replica-0"]
    assert records_of_task(path, "service") == [RECORDS[4]]
    assert records_of_task(tmp_path / "none.jsonl", "service") == []
    assert last_times_by_task(path) == {("", "master-replica-0"): RECORDS[6].time, ("3", "worker-replica-1"): RECORDS[2].time,
                                        ("", "worker-replica-1"): RECORDS[1].time, ("12", "master-replica-0"): RECORDS[3].time,
                                        ("2", "service"): RECORDS[4].time, ("", "evaluator-replica-0"): RECORDS[7].time,
                                        ("1", "ps-replica-2"): RECORDS[8].time}


def test_follow_blocks_hold_back_a_line_until_it_is_whole(tmp_path):
    path = tmp_path / "job.jsonl"
    data = written(RECORDS[:3])
    cut = len(written(RECORDS[:1])) + 10  # inside the second line
    path.write_bytes(data[:cut])
    done = threading.Event()
    blocks = follow_blocks(path, done.is_set, poll_seconds=0.01)
    assert next(blocks) == data[:len(written(RECORDS[:1]))]
    with path.open("ab") as handle:
        handle.write(data[cut:])
    done.set()
    assert b"".join(blocks) == data[len(written(RECORDS[:1])):]


def test_follow_waits_for_a_log_that_does_not_exist_yet(tmp_path):
    path = tmp_path / "later.jsonl"
    calls = []

    def done() -> bool:
        calls.append(1)
        if len(calls) == 2:
            JobLogWriter(path).service("created late")
        return len(calls) >= 3

    assert [r.message for batch in follow(path, done, poll_seconds=0.01) for r in batch] == ["created late"]


# -- the controller's copy: every line, however long the drain takes ---------------------------


def log_clock(monkeypatch) -> list[float]:
    """The copy's clock, moved by the test: [seconds]."""
    clock = [0.0]
    monkeypatch.setattr("aiptrain.runner.logcopy.time.monotonic", lambda: clock[0])
    return clock


def test_the_drain_waits_while_lines_keep_coming(tmp_path, monkeypatch):
    clock = log_clock(monkeypatch)
    batches = [[LogChunk(f"2026-01-01T00:00:{i:02d}.5Z", "stdout" if i % 2 else "stderr", f"line {i} ✓")]
               for i in range(12)]
    backend = FakeBackend(logs={"master-replica-0": batches}, hold_logs=True)
    backend.launch(plan_of("job"))
    backend.exit("job", "master-replica-0", 0)
    path = tmp_path / "job.jsonl"
    followers = LogFollowers(backend, JobLogWriter(path), {})
    followers.sync(backend.observe("job"))
    drain = Drain(followers, None)
    for _ in batches:  # each batch comes just before the patience runs out: the copy takes longer than it
        clock[0] += DRAIN_PATIENCE_SECONDS - 1
        assert not drain.done()
        backend.release_logs(1)
        assert not drain.done() or not followers.copying()
    for thread in followers._threads.values():
        thread.join(timeout=60)
    assert drain.done()
    records = read_records(path)[0]
    assert [r.message for r in records] == [f"line {i} ✓" for i in range(12)]
    assert [r.severity for r in records[:2]] == ["ERROR", "INFO"]  # stderr without a level, stdout


def test_a_resumed_copy_copies_every_line_once_when_the_streams_stamps_interleave(tmp_path):
    """The engine stamps stdout and stderr lines as it reads each pipe, so its stream can hold a
    stderr line stamped before the stdout lines it follows (the fault suite saw it). A controller
    killed right after copying that line is followed by one whose copy resumes there: neither
    the lines stamped after it (copied already) nor a line stamped before it (not copied yet)
    may come twice or go missing."""
    stamp = "2026-01-01T00:00:00.{:09d}Z".format
    engine = [LogChunk(stamp(100), "stdout", "line 0"), LogChunk(stamp(300), "stdout", "line 1"),
              LogChunk(stamp(400), "stdout", "line 2"), LogChunk(stamp(200), "stderr", "hello on stderr"),
              LogChunk(stamp(150), "stderr", "late on stderr"), LogChunk(stamp(500), "stdout", "line 3")]
    path = tmp_path / "job.jsonl"
    killed = JobLogWriter(path)  # the killed controller copied the engine's first four lines
    killed.write_lines([record_line(c.time, "master-replica-0", "INFO", c.text) for c in engine[:4]])
    backend = FakeBackend(logs={"master-replica-0": [[chunk] for chunk in engine]})
    backend.launch(plan_of("job"))
    backend.exit("job", "master-replica-0", 0)
    followers = LogFollowers(backend, JobLogWriter(path), last_times_by_task(path), path)
    followers.sync(backend.observe("job"))
    for thread in followers._threads.values():
        thread.join(timeout=60)
    assert [r.message for r in read_records(path)[0]] == [c.text for c in engine]


def test_the_drain_gives_up_on_a_stream_that_stalls(tmp_path, monkeypatch):
    clock = log_clock(monkeypatch)
    backend = FakeBackend(logs={"master-replica-0": ["never sent"]}, hold_logs=True)
    backend.launch(plan_of("job"))
    backend.exit("job", "master-replica-0", 0)
    path = tmp_path / "job.jsonl"
    followers = LogFollowers(backend, JobLogWriter(path), {})
    followers.sync(backend.observe("job"))
    drain = Drain(followers, None)
    clock[0] += DRAIN_PATIENCE_SECONDS - 1
    assert not drain.done() and followers.copying()
    clock[0] += 1
    assert drain.done() and followers.copying(), "the drain waits on a stream that sends nothing"
    assert not path.exists() or read_records(path)[0] == []
    backend.release_logs(1)  # let the follower thread end


def test_after_a_closing_line_follow_asks_about_the_job_soon_rather_than_at_its_poll(tmp_path, monkeypatch):
    path = tmp_path / "job.jsonl"
    JobLogWriter(path).service("Job completed successfully.")
    sleeps: list[float] = []
    monkeypatch.setattr("aiptrain.logs.time.sleep", sleeps.append)
    answers = iter([False, False, False, True])  # the final state lands a few looks after the line
    list(follow(path, lambda: next(answers), poll_seconds=5))
    assert sleeps and set(sleeps) == {CLOSING_POLL_SECONDS}

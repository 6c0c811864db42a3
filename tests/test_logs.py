"""Log records, severities and gcloud's line format."""

import threading

import pytest

from aiptrain.logs import (
    CLOSING_POLL_SECONDS,
    GROWTH_POLL_SECONDS,
    JobLogWriter,
    LogRecord,
    follow,
    format_record,
    read_records,
    severity_of,
    wait_for_growth,
)


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


def test_after_a_closing_line_follow_looks_again_soon_rather_than_at_its_poll(tmp_path, monkeypatch):
    path = tmp_path / "job.jsonl"
    JobLogWriter(path).service("Job completed successfully.")
    sleeps: list[float] = []
    monkeypatch.setattr("aiptrain.logs.time.sleep", sleeps.append)
    answers = iter([False, False, False, True])  # the final state lands two looks after the line
    list(follow(path, lambda: next(answers), poll_seconds=5))
    assert sleeps == [CLOSING_POLL_SECONDS] * 2


def test_follow_waits_its_poll_while_no_closing_line_came(tmp_path, monkeypatch):
    path = tmp_path / "job.jsonl"
    JobLogWriter(path).service("Waiting for training program to start.")
    JobLogWriter(path).write("service", "INFO", "Job completed successfully.", trial="1")  # a trial's, not the job's
    sleeps: list[float] = []
    monkeypatch.setattr("aiptrain.logs.time.sleep", sleeps.append)
    answers = iter([False, False, True])
    list(follow(path, lambda: next(answers), poll_seconds=0))  # 0: no waiting for the file to grow
    assert sleeps == []


def test_a_follower_wakes_when_the_file_grows_not_at_its_poll(tmp_path, monkeypatch):
    path = tmp_path / "job.jsonl"
    JobLogWriter(path).service("Waiting for training program to start.")
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        JobLogWriter(path).write("master-replica-0", "INFO", "a new line")

    monkeypatch.setattr("aiptrain.logs.time.sleep", sleep)
    wait_for_growth(path, path.stat().st_size, seconds=60)
    assert sleeps == [GROWTH_POLL_SECONDS]

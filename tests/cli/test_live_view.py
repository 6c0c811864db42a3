"""The terminal view of stream-logs, through a real pseudo-terminal, and the piped output that
must stay gcloud's plain lines byte for byte."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

from aiptrain.cli.live import Status, task_style
from aiptrain.client import Client
from aiptrain.logs import JobLogWriter, format_record, read_records
from aiptrain.model import Job, State

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def finished_job(home):
    """A SUCCEEDED job with a log of two replicas, several severities and a hostile escape."""
    with Client() as client:
        client.store.create(Job(job_id="shown"))
        client.store.transition("shown", State.RUNNING, [State.QUEUED])
        with JobLogWriter(client.settings.job_paths("shown").log) as log:
            log.service("Waiting for training program to start.")
            log.write("master-replica-0", "INFO", "step 1 of 2")
            log.write("worker-replica-0", "WARNING", "slow\nsecond line")
            log.write("master-replica-0", "ERROR", "clear screen: \x1b[2J done")
        client.store.transition("shown", State.SUCCEEDED, [State.RUNNING])
        records = read_records(client.settings.job_paths("shown").log)[0]
    return [line for record in records for line in format_record(record)]


def run_in_pty(argv: list[str], columns: int = 250, timeout: float = 120) -> str:
    """aiptrain ARGV with stdout and stderr on a pseudo-terminal; everything it wrote."""
    main, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "NO_COLOR")}
    env.update(TERM="xterm-256color", COLUMNS=str(columns))
    process = subprocess.Popen([sys.executable, "-m", "aiptrain", *argv], stdin=subprocess.DEVNULL,
                               stdout=secondary, stderr=secondary, env=env)
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(timeout=timeout)
    os.close(main)
    assert process.returncode == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


def test_piped_output_is_gcloud_plain_lines(finished_job, cli):
    result = cli("jobs", "stream-logs", "shown", check_code=0)
    lines = result.stdout.splitlines()
    assert len(lines) == len(finished_job)
    # Escape sequences in a message are the hardening's business (click strips them today).
    assert [line for line in lines if "clear screen" not in line] == \
        [line for line in finished_job if "clear screen" not in line]
    assert result.stdout.endswith("\n") and "\x1b" not in result.stderr


def test_terminal_gets_colours_and_a_status_line(finished_job):
    out = run_in_pty(["jobs", "stream-logs", "shown"])
    assert "\x1b[" in out
    plain = ANSI.sub("", out).replace("\r", "")
    for line in finished_job:
        severity, _, task, _, message = line.split("\t", 4)
        assert re.search(rf"{severity}\s+\S+ \S+ \S+\s+{task}\s+{re.escape(message.replace(chr(27), '')[:5])}", plain)
    assert "\\x1b[2J" in plain and "\x1b[2J" not in out  # shown, not obeyed
    assert re.search(r"\x1b\[31mERROR", out)  # severity in red
    assert re.search(r"SUCCEEDED\s+replicas: 0 starting · 0 running · 0 restarted · 0 exited\s+\d+:\d\d:\d\d", plain)


def test_no_color_keeps_plain_lines_on_a_terminal(finished_job):
    main, secondary = pty.openpty()
    env = {**os.environ, "NO_COLOR": "1", "TERM": "xterm-256color"}
    result = subprocess.run([sys.executable, "-m", "aiptrain", "jobs", "stream-logs", "shown"], stdout=secondary,
                            stderr=subprocess.PIPE, env=env, timeout=60)
    os.close(secondary)
    out = os.read(main, 65536).decode()
    os.close(main)
    assert result.returncode == 0
    plain_lines = [line for line in finished_job if "clear screen" not in line]
    assert [line for line in out.replace("\r\n", "\n").splitlines() if "clear screen" not in line] == plain_lines


def test_status_line_and_task_colours():
    from datetime import datetime, timedelta, timezone

    now = datetime(2026, 1, 1, 12, tzinfo=timezone.utc)
    status = Status("RUNNING", now - timedelta(seconds=3725), {"created": 1, "running": 2, "exited": 1}, 1)
    assert status.line(now).plain == "RUNNING    replicas: 1 starting · 2 running · 1 restarted · 1 exited   1:02:05"
    assert task_style("service") == "dim"
    assert task_style("worker-replica-1") != "dim"
    assert len({task_style(f"worker-replica-{n}") for n in range(8)}) > 1  # replicas differ



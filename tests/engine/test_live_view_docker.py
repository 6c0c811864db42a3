"""Submit --stream-logs on a terminal shows the running replicas of a real job."""

from __future__ import annotations

import re

from test_live_view import ANSI, run_in_pty


def test_submit_stream_logs_on_a_terminal_shows_running_replicas(home, submit_args):
    out = run_in_pty(submit_args("live_job", "--stream-logs", user_args=("--steps", "4", "--sleep", "0.7")),
                     timeout=300)
    plain = ANSI.sub("", out).replace("\r", "")
    assert "Job [live_job] submitted successfully." in plain
    assert re.search(r"RUNNING\s+replicas: \d starting · 1 running", plain)
    assert "master-replica-0" in plain and "state: SUCCEEDED" in plain

"""Raw bytes to the terminal: control characters escaped in what aiptrain prints, the problem
first."""

from __future__ import annotations

import pytest

from aiptrain.logs import printable


@pytest.mark.parametrize(
    "text, one_line, shown",
    [
        ("plain\ttab", False, "plain\ttab"),
        ("\x1b[2J\x1b]0;title\x07", False, "\\x1b[2J\\x1b]0;title\\x07"),
        ("line\rover", False, "line\\x0dover"),
        ("a\nb", False, "a\nb"),
        ("a\nb\tc", True, "a\\nb\\tc"),
        ("\x9b31m\x7f", False, "\\x9b31m\\x7f"),
        ("ünïcödé ✓", False, "ünïcödé ✓"),
    ],
)
def test_printable_escapes_terminal_controls(text, one_line, shown):
    assert printable(text, one_line) == shown


def test_error_lines_escape_control_characters_and_lead_with_the_problem(cli, home):
    bad = "job\x1b]0;pwned\x07\nid"
    result = cli("jobs", "describe", bad)
    assert result.returncode == 2
    assert result.stderr == "ERROR: Job [job\\x1b]0;pwned\\x07\\nid] not found; `aiptrain jobs list` shows the jobs that exist.\n"
    usage = cli("jobs", "submit", "training")
    assert usage.returncode == 2
    assert usage.stderr.startswith("ERROR: Missing argument 'JOB'. Usage: aiptrain jobs submit training ")
    assert len(usage.stderr.splitlines()) == 1  # the usage and the way to the help on the same line

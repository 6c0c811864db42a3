"""Shell completion (click's): commands, flags, and job IDs read from the store."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from aiptrain.client import Client
from aiptrain.model import Job


def complete(words: str, shell: str = "bash") -> list[str]:
    """What `aiptrain` offers for the last word of `words` (a completion request as bash sends it)."""
    env = {**os.environ, "_AIPTRAIN_COMPLETE": f"{shell}_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
    out = subprocess.run([sys.executable, "-m", "aiptrain"], env=env, capture_output=True, text=True,
                         check=True).stdout
    return [line.split(",", 1)[1] for line in out.splitlines() if line]


@pytest.fixture
def jobs_in_store(home):
    from datetime import datetime, timedelta, timezone

    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with Client() as client:
        for hour, job_id in enumerate(("census_1", "census_2", "mnist_1")):
            client.store.create(Job(job_id=job_id, create_time=start + timedelta(hours=hour)))


@pytest.mark.parametrize("words, offered", [
    ("aiptrain jobs describe cen", ["census_2", "census_1"]),  # newest first
    ("aiptrain jobs stream-logs m", ["mnist_1"]),
    ("aiptrain jobs cancel x", []),
    ("aiptrain jobs update census_1 --clear", ["--clear-labels"]),
    ("aiptrain jobs list --so", ["--sort-by"]),
    ("aiptrain jobs up", ["update"]),
    ("aiptrain ru", ["runtimes"]),
])
def test_completion(jobs_in_store, words, offered):
    assert complete(words) == offered


def test_job_ids_complete_without_a_store(home):
    assert complete("aiptrain jobs describe ") == []


def test_bash_source_script():
    env = {**os.environ, "_AIPTRAIN_COMPLETE": "bash_source"}
    script = subprocess.run([sys.executable, "-m", "aiptrain"], env=env, capture_output=True, text=True).stdout
    assert "complete -o nosort -F _aiptrain_completion aiptrain" in script

"""A --job-dir that would expose aiptrain's home to replicas is refused."""

from __future__ import annotations

import pytest

from conftest import REPO


@pytest.mark.parametrize("where", ["home", "inside", "parent"])
def test_a_job_dir_that_exposes_aiptrains_home_is_refused(cli, home, where):
    home.mkdir(parents=True)
    job_dir = {"home": home, "inside": home / "logs" / "x", "parent": home.parent}[where]
    result = cli("jobs", "submit", "training", "exposes_home", "--package-path",
                 str(REPO / "sample_jobs" / "basic" / "trainer"), "--module-name", "trainer.task",
                 "--job-dir", str(job_dir), "--region", "us-central1", "--runtime-version", "minimal")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "would expose aiptrain's home" in result.stderr
    assert not (home / "jobs.db").exists() or "Listed 0 items." in cli("jobs", "list").stderr

"""The CI examples' pipelines around real jobs on the engine: a job that succeeds passes, one that
fails fails."""

from __future__ import annotations

from test_ci_examples import run_script


def test_a_job_that_succeeds_passes_the_pipeline(home, tmp_path, minimal_runtime):
    result, resource, logs = run_script(tmp_path, "ci_ok", "--", "--steps", "3")
    assert result.returncode == 0, result.stderr
    assert resource["state"] == "SUCCEEDED" and resource["labels"] == {"ci": "true"}
    assert "\tmaster-replica-0\t" in logs and "\tmaster-replica-0\t" in result.stderr  # streamed, and kept


def test_a_job_that_fails_fails_the_pipeline(home, tmp_path, minimal_runtime):
    result, resource, logs = run_script(tmp_path, "ci_fails", "--", "--steps", "2", "--fail-with", "3")
    assert result.returncode == 1
    assert resource["state"] == "FAILED" and "non-zero status of 3" in resource["errorMessage"]
    assert logs

"""Packages with dependencies on the real engine: installed offline from the wheelhouse, or refused
with nothing created."""

from __future__ import annotations

import json
import shutil

import yaml

from conftest import job_resources
from test_packaging import WITH_DEPENDENCY


def test_sample_with_dependency_runs_offline_and_imports_it(cli, home, tmp_path, minimal_runtime, docker_api):
    job_dir = tmp_path / "dep-out"
    result = cli(
        "jobs", "submit", "training", "with_dependency", "--package-path", str(WITH_DEPENDENCY),
        "--module-name", "trainer.task", "--job-dir", str(job_dir), "--runtime-version", minimal_runtime,
        "--stream-logs", "--", "--steps", "8",
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    # The replica imported tabulate from what it installed (its user site), not from the image.
    assert "Imported tabulate 0." in result.stderr
    assert "/tmp/.local/lib/python3.11/site-packages/tabulate" in result.stderr
    assert json.loads((job_dir / "model.json").read_text())["tabulate"].startswith("0.")
    # The wheelhouse was staged beside the package, as the record of what the replicas installed.
    staged = list((job_dir / "packages").glob("*/wheelhouse/tabulate-*.whl"))
    assert len(staged) == 1
    assert job_resources(docker_api, "with_dependency") == []


def test_unresolvable_dependency_exits_2_with_nothing_created(cli, home, tmp_path, minimal_runtime, docker_api):
    root = tmp_path / "src"
    shutil.copytree(WITH_DEPENDENCY.parent, root, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    setup = root / "setup.py"
    setup.write_text(setup.read_text().replace('"tabulate>=0.8"', '"aiptrain-no-such-project-xyz>=1"'))
    job_dir = tmp_path / "bad-out"
    result = cli(
        "jobs", "submit", "training", "bad_dependency", "--package-path", str(root / "trainer"),
        "--module-name", "trainer.task", "--job-dir", str(job_dir), "--runtime-version", minimal_runtime,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "aiptrain-no-such-project-xyz" in result.stderr
    assert cli("jobs", "list").stderr.strip() == "Listed 0 items."
    assert job_resources(docker_api, "bad_dependency") == []
    assert not job_dir.exists()

"""examples/ci: the pipelines' YAML, and the one script they run, against the real engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from conftest import REPO

CI = REPO / "examples" / "ci"
SCRIPT = CI / "run-training.sh"


def test_pipelines_run_the_script_and_keep_artifacts():
    github = yaml.safe_load((CI / "github-actions.yml").read_text())
    steps = github["jobs"]["train"]["steps"]
    assert any("examples/ci/run-training.sh" in step.get("run", "") for step in steps)
    upload = next(step for step in steps if step.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "artifacts/"
    gitlab = yaml.safe_load((CI / "gitlab-ci.yml").read_text())["train"]
    assert any("examples/ci/run-training.sh" in line for line in gitlab["script"])
    assert gitlab["artifacts"]["when"] == "always" and gitlab["artifacts"]["paths"] == ["artifacts/"]


def run_script(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None, str]:
    artifacts = tmp_path / "artifacts"
    env = {**os.environ, "AIPTRAIN": f"{sys.executable} -m aiptrain", "RUNTIME_VERSION": "minimal",
           "ARTIFACTS_DIR": str(artifacts)}
    result = subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    resource = json.loads((artifacts / "job.json").read_text()) if (artifacts / "job.json").exists() else None
    logs = (artifacts / "job.log").read_text() if (artifacts / "job.log").exists() else ""
    return result, resource, logs


def test_a_refused_submit_keeps_no_artifacts(home, tmp_path):
    result, resource, logs = run_script(tmp_path, "9bad")
    assert result.returncode == 2 and resource is None and logs == ""

"""A gcloud command line that runs a package in a custom image, on the real engine."""

from __future__ import annotations

import json
import uuid

from conftest import SAMPLE_TRAINER


def test_a_package_runs_in_a_custom_image_and_the_job_is_its_projects(cli, docker_api, minimal_runtime, tmp_path):
    """AI Platform's pre-built containers: the package is installed in the image and
    `python3 -m MODULE ARGS --job-dir DIR` runs. The minimal runtime image plays the custom image."""
    job_id = f"prebuilt_{uuid.uuid4().hex[:8]}"
    job_dir = tmp_path / "out"
    result = cli("ai-platform", "jobs", "submit", "training", job_id, "--project", "my-project",
                 "--master-image-uri", "aiptrain/runtime:minimal", "--package-path", str(SAMPLE_TRAINER),
                 "--module-name", "trainer.task", "--job-dir", str(job_dir), "--region", "us-central1",
                 "--stream-logs", "--", "--steps", "5")
    assert result.returncode == 0, result.stderr
    assert "Running command: python3 -m trainer.task --steps 5 --job-dir" in result.stderr
    assert (job_dir / "model.json").is_file()
    described = cli("ml-engine", "jobs", "describe", job_id, "--project", "my-project", "--format", "json",
                    check_code=0)
    resource = json.loads(described.stdout)
    assert resource["state"] == "SUCCEEDED"
    assert resource["trainingInput"]["masterConfig"] == {"imageUri": "aiptrain/runtime:minimal"}
    assert "my-project" not in described.stdout  # the REST body has no project: gcloud keeps it in the name
    assert cli("jobs", "describe", job_id, "--project", "my-project", "--format=value(state)",
               check_code=0).stdout == "SUCCEEDED\n"
    assert job_id in cli("jobs", "describe", job_id, check_code=2).stderr  # the job is my-project's alone

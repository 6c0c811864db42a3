"""sample_jobs/sklearn_xgboost on the 2.11 runtime: scikit-learn, XGBoost and cloudml-hypertune
come with the image (as on AI Platform), so the job resolves nothing and saves both models."""

from __future__ import annotations

import json

import yaml

from conftest import REPO, job_resources, require_image, runtime_image

SAMPLE = REPO / "sample_jobs" / "sklearn_xgboost" / "trainer"


def test_sklearn_xgboost_sample_trains_and_saves_its_models(cli, home, tmp_path, docker_api):
    require_image(docker_api, runtime_image("2.11"))
    job_dir = tmp_path / "skl-out"
    result = cli(
        "jobs", "submit", "training", "sklearn_xgboost", "--package-path", str(SAMPLE),
        "--module-name", "trainer.task", "--job-dir", str(job_dir), "--runtime-version", "2.11",
        "--stream-logs", timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    assert "Resolving" not in result.stderr and not list(job_dir.glob("packages/*/wheelhouse"))
    metrics = json.loads((job_dir / "metrics.json").read_text())
    assert (metrics["sklearn_version"], metrics["xgboost_version"]) == ("1.0.2", "1.6.2")
    assert metrics["xgboost_accuracy"] > 0.8 and metrics["logistic_regression_accuracy"] > 0.8
    assert (job_dir / "model.joblib").stat().st_size > 0 and (job_dir / "model.bst").stat().st_size > 0
    assert job_resources(docker_api, "sklearn_xgboost") == []

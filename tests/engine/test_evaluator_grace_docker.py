"""Evaluators on the real engine get a grace period after the master succeeds, and an Estimator's
train_and_evaluate keeps its final evaluation."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from conftest import REPO, job_resources, require_image

PROBE = REPO / "tests" / "trainers" / "probe"


def config_file(tmp_path: Path) -> str:
    path = tmp_path / "evaluator.yaml"
    path.write_text(yaml.safe_dump({"trainingInput": {
        "scaleTier": "CUSTOM", "masterType": "n1-standard-4",
        "workerType": "n1-standard-4", "workerCount": 1,
        "evaluatorType": "n1-standard-4", "evaluatorCount": 1}}))
    return str(path)


def messages(stderr: str, task: str) -> list[str]:
    fields = (line.split("\t") for line in stderr.splitlines() if line.count("\t") == 4)
    return [f[4] for f in fields if f[2] == task]


@pytest.mark.parametrize("grace, evaluator_runs, finishes", [("60", "3", True), ("0.5", "120", False)])
def test_evaluators_get_a_grace_period_after_the_master_succeeds(
    cli, home, docker_api, minimal_runtime, tmp_path, monkeypatch, grace, evaluator_runs, finishes
):
    monkeypatch.setenv("AIPTRAIN_EVALUATOR_GRACE_SECONDS", grace)
    monkeypatch.setenv("AIPTRAIN_STOP_GRACE_SECONDS", "1")
    job_id = f"grace_{uuid.uuid4().hex[:8]}"
    result = cli("jobs", "submit", "training", job_id, "--config", config_file(tmp_path),
                 "--package-path", str(PROBE), "--module-name", "probe.task", "--region", "us-central1",
                 "--runtime-version", minimal_runtime, "--stream-logs", "--",
                 "--run", "master=0.5", "--run", "worker=120", "--run", f"evaluator={evaluator_runs}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    service = messages(result.stderr, "service")
    assert any(m.startswith("The master finished: waiting up to") and "evaluator 0" in m for m in service)
    evaluator = messages(result.stderr, "evaluator-replica-0")
    assert ("probe evaluator 0 exiting with 0" in evaluator) is finishes
    assert "probe worker 0 exiting with 0" not in messages(result.stderr, "worker-replica-0")  # stopped at once
    assert job_resources(docker_api, job_id) == []


@pytest.mark.tensorflow
def test_estimator_train_and_evaluate_keeps_the_final_evaluation(cli, home, docker_api, tmp_path):
    require_image(docker_api, "aiptrain/runtime:2.11")
    job_id = f"estimator_{uuid.uuid4().hex[:8]}"
    job_dir = tmp_path / "estimator-out"
    config = tmp_path / "estimator.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {
        "scaleTier": "CUSTOM", "masterType": "n1-standard-4",
        "workerType": "n1-standard-4", "workerCount": 1,
        "parameterServerType": "n1-standard-4", "parameterServerCount": 1,
        "evaluatorType": "n1-standard-4", "evaluatorCount": 1}}))
    steps = 100
    result = cli("jobs", "submit", "training", job_id, "--config", str(config),
                 "--package-path", str(REPO / "sample_jobs" / "tf_estimator" / "trainer"),
                 "--module-name", "trainer.task", "--job-dir", str(job_dir), "--region", "us-central1",
                 "--runtime-version", "2.11", "--stream-logs", "--", "--steps", str(steps), timeout=600)
    assert result.returncode == 0, result.stderr[-5000:]
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    final = json.loads((job_dir / "model" / "export" / "metrics" / f"metrics-{steps}.json").read_text())
    assert final["global_step"] == steps and final["checkpoint"] == f"model.ckpt-{steps}"
    assert final["weight"] == pytest.approx(3.0, abs=0.3) and final["bias"] == pytest.approx(1.0, abs=0.3)
    assert "evaluator 0: done" in messages(result.stderr, "evaluator-replica-0")
    assert job_resources(docker_api, job_id) == []

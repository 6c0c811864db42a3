"""A dependency published only as an sdist is built on the host and imported offline by a real job."""

from __future__ import annotations

import json

import yaml

from conftest import job_resources

HYPERTUNE_TRAINER = '''
import argparse, json, os
import hypertune
parser = argparse.ArgumentParser()
parser.add_argument("--job-dir", required=True)
args = parser.parse_args()
hypertune.HyperTune().report_hyperparameter_tuning_metric(
    hyperparameter_metric_tag="accuracy", metric_value=0.5, global_step=1)
print("Imported hypertune from", hypertune.__file__, flush=True)
os.makedirs(args.job_dir, exist_ok=True)
with open(os.path.join(args.job_dir, "done.json"), "w") as out:
    json.dump({"hypertune": hypertune.__file__}, out)
'''


def test_an_sdist_only_dependency_is_built_on_the_host_and_imported_offline(
    cli, home, tmp_path, minimal_runtime, docker_api
):
    root = tmp_path / "src"
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "__init__.py").write_text("")
    (root / "trainer" / "task.py").write_text(HYPERTUNE_TRAINER)
    # 0.1.0.dev6 is published only as an sdist (older dev releases had wheels).
    (root / "setup.py").write_text(
        "from setuptools import setup\n"
        "setup(name='trainer', version='0.1', packages=['trainer'], install_requires=['cloudml-hypertune>=0.1.0.dev6'])\n"
    )
    job_dir = tmp_path / "ht-out"
    result = cli(
        "jobs", "submit", "training", "hypertune_dep", "--package-path", str(root / "trainer"),
        "--module-name", "trainer.task", "--job-dir", str(job_dir), "--runtime-version", minimal_runtime,
        "--stream-logs",
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    assert "/tmp/.local/lib/python3.11/site-packages/hypertune" in result.stderr
    assert "hypertune" in json.loads((job_dir / "done.json").read_text())["hypertune"]
    staged = list((job_dir / "packages").glob("*/wheelhouse/cloudml_hypertune-0.1.0.dev6-py2.py3-none-any.whl"))
    assert len(staged) == 1
    assert job_resources(docker_api, "hypertune_dep") == []

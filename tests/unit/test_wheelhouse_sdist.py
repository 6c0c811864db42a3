"""Dependencies published only as an sdist (cloudml-hypertune): the host builds their wheel
(pure Python only) into the wheelhouse, and replicas install it with no index."""

from __future__ import annotations

import json
import zipfile

import pytest
import yaml

from aiptrain import wheelhouse
from aiptrain.errors import ValidationError

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


def _wheel(path, name, requires):
    with zipfile.ZipFile(path, "w") as archive:
        metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(
            f"Requires-Dist: {r}\n" for r in requires
        )
        archive.writestr(f"{name}-1.0.dist-info/METADATA", metadata)


def test_requirements_pip_skipped_by_the_hosts_markers_are_found(tmp_path):
    _wheel(tmp_path / "markdown-1.0-py3-none-any.whl", "markdown", [
        'importlib-metadata>=4.4; python_version < "3.10"', "zipp; python_version >= '3.12'",
        "pytest; extra == 'testing'", "tomli>=1",
    ])
    _wheel(tmp_path / "tomli-1.0-py3-none-any.whl", "tomli", [])
    assert wheelhouse.marker_requirements_missed(tmp_path, "3.9") == ["importlib-metadata>=4.4"]
    assert wheelhouse.marker_requirements_missed(tmp_path, "3.11") == []


@pytest.mark.docker
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


def test_an_sdist_whose_c_extension_is_optional_is_built_pure(tmp_path):
    """TensorFlow 2.5/2.6 pin wrapt~=1.12.1, published only as an sdist with a C extension."""
    wheel = wheelhouse.build_pure_wheel("wrapt==1.12.1", tmp_path)
    assert wheel.name == "wrapt-1.12.1-py3-none-any.whl"


def test_an_image_build_is_not_told_to_pass_packages(monkeypatch, tmp_path):
    monkeypatch.setitem(wheelhouse.PURE_BUILD_ENV, "wrapt", {})  # as before: its C extension (or no compiler)
    with pytest.raises(ValidationError) as caught:
        wheelhouse.build_pure_wheel("wrapt==1.12.1", tmp_path, hint="")
    assert "[wrapt] publishes no wheel" in str(caught.value) and "--packages" not in str(caught.value)

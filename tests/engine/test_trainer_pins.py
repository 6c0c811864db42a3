"""A trainer that pins other framework releases than its runtime image holds gets them, as pip
on AI Platform installed them, while what it only names keeps the image's releases (protobuf
stays where the image's TensorFlow needs it)."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from conftest import job_resources, require_image, runtime_image

pytestmark = pytest.mark.tensorflow

PRINT_VERSIONS = '''
import argparse, json, os
import google.protobuf, google.cloud.storage, keras, pandas, tensorflow as tf
parser = argparse.ArgumentParser()
parser.add_argument("--job-dir", required=True)
args = parser.parse_args()
versions = {"tensorflow": tf.__version__, "pandas": pandas.__version__, "keras": keras.__version__,
            "protobuf": google.protobuf.__version__, "google-cloud-storage": google.cloud.storage.__version__}
print("Imported", json.dumps(versions, sort_keys=True), flush=True)
tf.constant(1.0) + 1.0  # the pinned TensorFlow runs, not only imports
os.makedirs(args.job_dir, exist_ok=True)
with open(os.path.join(args.job_dir, "versions.json"), "w") as out:
    json.dump(versions, out)
'''


def test_a_trainer_pinning_another_tensorflow_and_pandas_gets_them_and_succeeds(cli, home, tmp_path, docker_api):
    require_image(docker_api, runtime_image("2.11"))
    labels = docker_api.inspect_image(runtime_image("2.11"))["Config"]["Labels"] or {}
    assert "aiptrain.installed" in labels, "an image built before images recorded their releases: " \
        "rebuild it (aiptrain runtimes build --force 2.11)"
    held = dict(p.split("==") for p in labels["aiptrain.installed"].split())
    root = tmp_path / "src"
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "__init__.py").write_text("")
    (root / "trainer" / "task.py").write_text(PRINT_VERSIONS)
    (root / "setup.py").write_text(textwrap.dedent("""\
        from setuptools import setup
        setup(name="trainer", version="0.1", packages=["trainer"],
              install_requires=["tensorflow==2.8.0", "pandas==1.4.1", "google-cloud-storage"])
        """))
    job_dir = tmp_path / "pins-out"
    result = cli("jobs", "submit", "training", "pins_tf28", "--package-path", str(root / "trainer"),
                 "--module-name", "trainer.task", "--job-dir", str(job_dir), "--runtime-version", "2.11",
                 "--region", "us-central1", "--stream-logs", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    versions = json.loads((job_dir / "versions.json").read_text())
    assert versions["tensorflow"] == "2.8.0" and versions["pandas"] == "1.4.1"
    assert versions["keras"].startswith("2.8.")  # moved with the pinned TensorFlow
    # Named, not pinned: the image's own releases, protobuf included.
    assert versions["protobuf"] == held["protobuf"] and versions["google-cloud-storage"] == held["google-cloud-storage"]
    assert job_resources(docker_api, "pins_tf28") == []


def test_a_library_that_needs_another_protobuf_than_the_image_holds_is_refused_in_one_line(
    cli, home, tmp_path, docker_api
):
    require_image(docker_api, runtime_image("2.11"))
    root = tmp_path / "src"
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "__init__.py").write_text("")
    (root / "trainer" / "task.py").write_text("print('never runs')\n")
    (root / "setup.py").write_text(
        "from setuptools import setup\n"
        "setup(name='trainer', version='0.1', packages=['trainer'], install_requires=['grpcio-status==1.70.0'])\n"
    )
    result = cli("jobs", "submit", "training", "needs_protobuf5", "--package-path", str(root / "trainer"),
                 "--module-name", "trainer.task", "--job-dir", str(tmp_path / "out"), "--runtime-version", "2.11",
                 "--region", "us-central1")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("ERROR: The trainer's requirements conflict with runtime 2.11's image: ")
    assert "grpcio-status 1.70.0 requires protobuf" in lines[0] and "runtime 2.11 holds protobuf 3.19.6" in lines[0]
    assert "pin protobuf" in lines[0]
    assert cli("jobs", "list").stderr.strip() == "Listed 0 items."
    assert not (tmp_path / "out").exists()

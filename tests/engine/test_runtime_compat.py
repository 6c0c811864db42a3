"""Trainers as their runtime's era wrote them, unchanged, on the images that run newer releases
(docs/reference/runtimes.md, "Given back"): a scikit-learn trainer of the quickstart's shape
(`from sklearn.externals import joblib`, the pre-0.24 module path, `DataFrame.as_matrix`) on runtime
2.1 and on 1.15; an XGBoost trainer on 1.14 uploading its model with google.cloud.storage; and
`import tensorflow` on 1.15, which holds no TensorFlow, ending in one line. gs:// is kept on the
host (AIPTRAIN_GCS=local) and served by the installation's storage endpoint. The images are
beyond `make images`: `make test-runtimes` builds them (1.x has no TensorFlow: about 1 GB)."""

from __future__ import annotations

import uuid

import pytest
import yaml

from conftest import require_image, runtime_image
from test_gcs_endpoint import XGBOOST, package

pytestmark = [pytest.mark.runtimes]

# As the 2019-2020 getting-started trainers for scikit-learn wrote it.
SKLEARN_2019 = """
    import argparse

    import pandas as pd
    from google.cloud import storage
    from sklearn.ensemble.forest import RandomForestClassifier
    from sklearn.externals import joblib

    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True)
    args = parser.parse_args()
    frame = pd.DataFrame({"x1": [i % 7 for i in range(80)], "x2": [i % 5 for i in range(80)]})
    frame["label"] = (frame.x1 > frame.x2).astype(int)
    features = frame.as_matrix(columns=["x1", "x2"])
    model = RandomForestClassifier(n_estimators=10, random_state=0).fit(features, frame.label.values)
    print("accuracy", model.score(features, frame.label.values))
    joblib.dump(model, "model.joblib")
    bucket, _, prefix = args.job_dir[len("gs://"):].partition("/")
    blob = storage.Client().bucket(bucket).blob(prefix + "/model.joblib")
    blob.upload_from_filename("model.joblib")
    print("uploaded", blob.name, "read back", type(joblib.load("model.joblib")).__name__)
"""

TENSORFLOW_1X = """
    import tensorflow as tf

    print(tf.__version__)
"""


def submit(cli, version: str, trainer, job_dir: str):
    job_id = f"compat_{version.replace('.', '_')}_{uuid.uuid4().hex[:6]}"
    return cli("jobs", "submit", "training", job_id, "--package-path", str(trainer), "--module-name", "trainer.task",
               "--job-dir", job_dir, "--region", "us-central1", "--runtime-version", version, "--stream-logs",
               timeout=900)


@pytest.mark.parametrize("version", ["2.1", "1.15"])
def test_a_scikit_learn_trainer_saving_with_sklearn_externals_joblib_runs_unchanged(
    cli, gcs_home, tmp_path, docker_api, version
):
    require_image(docker_api, runtime_image(version))
    result = submit(cli, version, package(tmp_path, "sk2019", task=SKLEARN_2019), "gs://sk2019-out/run")
    assert result.returncode == 0, result.stderr[-6000:]
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    assert f"NOTE: runtime {version} runs " in result.stderr and "sklearn.externals.joblib and .six" in result.stderr
    assert "accuracy 1.0" in result.stderr and "read back RandomForestClassifier" in result.stderr
    assert (gcs_home / "gcs" / "sk2019-out" / "run" / "model.joblib").is_file()


def test_an_xgboost_trainer_on_runtime_1_14_uploads_its_model_with_google_cloud_storage(
    cli, gcs_home, tmp_path, docker_api
):
    require_image(docker_api, runtime_image("1.14"))
    result = submit(cli, "1.14", package(tmp_path, "xgb_1_14", task=XGBOOST), "gs://xgb-1-14/run")
    assert result.returncode == 0, result.stderr[-6000:]
    model = gcs_home / "gcs" / "xgb-1-14" / "run" / "model.bst"
    assert model.is_file() and f"uploaded run/model.bst {model.stat().st_size}" in result.stderr


def test_importing_tensorflow_on_runtime_1_15_fails_at_once_with_one_line(cli, gcs_home, tmp_path, docker_api):
    require_image(docker_api, runtime_image("1.15"))
    result = submit(cli, "1.15", package(tmp_path, "tf_1_15", task=TENSORFLOW_1X), "gs://tf-1-15/run")
    assert result.returncode != 0
    assert "a trainer that imports tensorflow fails: try --runtime-version 2.1" in result.stderr  # the NOTE, at submit
    replica = [line for line in result.stderr.splitlines() if "\tmaster-replica-0\t" in line]
    line = ("ERROR: runtime 1.15 has no TensorFlow here: TensorFlow 1.15.0 has no build for Python 3.9, and no older "
            "Python is to be had. Try --runtime-version 2.1")
    assert [entry for entry in replica if line in entry], "\n".join(replica[-20:])
    assert not [entry for entry in replica if "Traceback" in entry]

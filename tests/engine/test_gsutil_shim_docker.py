"""A gcloud pipeline runs unedited through the gsutil and gcloud shims, its job on the real engine."""

import os
import subprocess
import sys
import textwrap

import pytest

TRAINER = textwrap.dedent("""\
    import argparse
    import tensorflow as tf
    parser = argparse.ArgumentParser()
    parser.add_argument("--train-files")
    parser.add_argument("--output-dir")
    parser.add_argument("--job-dir")
    args = parser.parse_args()
    rows = tf.io.gfile.GFile(args.train_files).read().split()
    tf.io.gfile.makedirs(args.output_dir)
    with tf.io.gfile.GFile(args.output_dir + "/count.txt", "w") as out:
        out.write(str(len(rows)))
    print("read", args.train_files, "wrote", args.output_dir, flush=True)
    """)


@pytest.fixture
def tf_runtime(docker_api):
    from conftest import require_image, runtime_image

    require_image(docker_api, runtime_image("2.11"))
    return "2.11"


@pytest.mark.tensorflow
def test_a_gcloud_pipeline_runs_unedited_through_the_shims(home, tmp_path, tf_runtime, monkeypatch):
    package = tmp_path / "src" / "trainer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "task.py").write_text(TRAINER)
    (tmp_path / "train.csv").write_text("a\nb\nc\n")
    bin_dir = tmp_path / "bin"
    subprocess.run([sys.executable, "-m", "aiptrain", "gcloud-shim", "install", str(bin_dir)], check=True,
                   capture_output=True)
    script = tmp_path / "pipeline.sh"
    script.write_text(textwrap.dedent(f"""\
        set -euo pipefail
        PROJECT=$(gcloud config get-value project)
        BUCKET=gs://${{PROJECT}}-ml
        gsutil mb -l us-central1 $BUCKET
        gcloud storage cp {tmp_path}/train.csv $BUCKET/data/train.csv
        gcloud ai-platform jobs submit training pipeline_job --stream-logs \\
          --package-path {package} --module-name trainer.task --region us-central1 \\
          --runtime-version {tf_runtime} --job-dir $BUCKET/jobs/pipeline_job \\
          -- --train-files=$BUCKET/data/train.csv --output-dir $BUCKET/output
        gsutil cat $BUCKET/output/count.txt
        """))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CLOUDSDK_CORE_PROJECT": "acme",
           "AIPTRAIN_GCS": "local"}
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[-1] == "3"
    gcs = home / "gcs"
    assert (gcs / "acme-ml" / "output" / "count.txt").read_text() == "3"
    assert "read gs://acme-ml/data/train.csv wrote gs://acme-ml/output" in result.stderr  # as on the service
    described = subprocess.run([sys.executable, "-m", "aiptrain", "jobs", "describe", "pipeline_job"],
                               capture_output=True, text=True, env=env)
    assert "--train-files=gs://acme-ml/data/train.csv" in described.stdout  # the record keeps the URLs

"""Jobs see their own project's buckets only (issue: a team server that keeps teams apart): a
trainer of team-b, in a real replica, asks for team-a's data through every client a trainer
has (google-cloud-storage, TensorFlow's GCS file system, gsutil, gcloud storage, a plain HTTPS
request to the endpoint without its credential) and gets 403 or 401 each time, while its own
project's bucket takes its output."""

from __future__ import annotations

import uuid

from aiptrain.cli.gsutil import LocalGcs, run

from test_gcs_endpoint import package, submit
from test_gcs_endpoint import tf_runtime as tf_runtime  # a fixture

HOSTILE = """
    import argparse
    import json
    import os
    import ssl
    import subprocess
    import urllib.error
    import urllib.request

    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True)
    args = parser.parse_args()
    theirs = "gs://team-a-data/secret.txt"

    def attempt(name, action):
        try:
            print("REACHED", name, repr(action())[:80], flush=True)
        except Exception as exc:  # every client's refusal, whatever its type
            print("REFUSED", name, type(exc).__name__, str(exc).replace("\\n", " ")[:160], flush=True)

    from google.cloud import storage

    client = storage.Client()
    attempt("google-cloud-storage", lambda: client.bucket("team-a-data").blob("secret.txt").download_as_bytes())
    attempt("list", lambda: [b.name for b in client.list_blobs("team-a-data")])
    attempt("overwrite", lambda: client.bucket("team-a-data").blob("secret.txt").upload_from_string(b"bob"))
    import tensorflow as tf

    attempt("tf.io.gfile", lambda: tf.io.gfile.GFile(theirs, "rb").read())

    def tool(*command):
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-120:]}")
        return done.stdout

    attempt("gsutil", lambda: tool("gsutil", "cat", theirs))
    attempt("gcloud-storage", lambda: tool("gcloud", "storage", "cat", theirs))
    anonymous = "https://storage.googleapis.com/storage/v1/b/team-a-data/o/secret.txt?alt=media"
    attempt("anonymous-https", lambda: urllib.request.urlopen(anonymous, context=ssl.create_default_context(),
                                                              timeout=20).read())
    client.bucket("team-b-out").blob("run/ours.txt").upload_from_string(b"team-b's output")
    with tf.io.gfile.GFile(args.job_dir.rstrip("/") + "/by-tf.txt", "w") as handle:
        handle.write("written by tf")
    print("OWN", tool("gsutil", "cat", "gs://team-b-out/run/ours.txt"), flush=True)
    print("PROJECT", os.environ["GOOGLE_CLOUD_PROJECT"], flush=True)
"""


def test_a_trainer_of_one_project_reaches_no_other_projects_bucket(cli, gcs_home, tf_runtime, tmp_path):
    gcs = LocalGcs(gcs_home / "gcs")
    run(gcs, "mb", ["-p", "team-a", "gs://team-a-data"])
    (tmp_path / "secret.txt").write_text("team-a's secret")
    run(gcs, "cp", [str(tmp_path / "secret.txt"), "gs://team-a-data/secret.txt"])
    run(gcs, "mb", ["-p", "team-b", "gs://team-b-out"])
    job_id = f"hostile_{uuid.uuid4().hex[:6]}"
    result = submit(cli, job_id, package(tmp_path, "hostile", task=HOSTILE), "--job-dir", "gs://team-b-out/run",
                    "--project", "team-b")
    assert result.returncode == 0, result.stderr[-6000:]
    lines = result.stderr.splitlines()
    for name in ("google-cloud-storage", "list", "overwrite", "tf.io.gfile", "gsutil", "gcloud-storage",
                 "anonymous-https"):
        [said] = [line for line in lines if f" {name} " in line and ("REACHED" in line or "REFUSED" in line)]
        assert "REFUSED" in said and any(word in said for word in ("403", "401", "Forbidden", "PermissionDenied",
                                                                   "Unauthorized", "denied on resource")), said
    assert (gcs_home / "gcs" / "team-a-data" / "secret.txt").read_text() == "team-a's secret"
    assert (gcs_home / "gcs" / "team-b-out" / "run" / "by-tf.txt").read_text() == "written by tf"
    assert any(line.endswith("OWN team-b's output") for line in lines), result.stderr[-3000:]
    assert any(line.endswith("PROJECT team-b") for line in lines)

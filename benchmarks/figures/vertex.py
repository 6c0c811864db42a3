"""Figure 14: a Vertex AI BASIC-equivalent custom job (one pool, one replica) created through the
aiplatform v1 REST API, to SUCCEEDED, beside the AI Platform job of the same trainer through the
ml v1 REST API (issue 37's target: within 1.2x); both polled every 0.1 s, both on runtime 2.11
(the Vertex job names the prebuilt tf-cpu.2-11 image, which maps to it), the package staged once
in the server's Cloud Storage. 14b: the google-cloud-aiplatform SDK's `CustomJob.run()` of the
same job, whose own poll (every 5 s at first) is the client's, beside the same create polled at
0.1 s: what a user of the SDK feels, measured apart from what the server does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from figures.gcloud import _served_url
from harness import Bench, BenchError, Row, interleaved, timed

BUCKET = "bench-vertex"
EXECUTOR = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-11.py310:latest"
POLL_SECONDS = 0.1
PROJECT = "aiptrain"
SDK_RUN = """
import sys
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform
url, package = sys.argv[1:3]
aiplatform.init(project="aiptrain", location="us-central1", api_endpoint=url, api_transport="rest",
                credentials=AnonymousCredentials(), staging_bucket="gs://bench-vertex/sdk")
job = aiplatform.CustomJob(display_name="bench-sdk", worker_pool_specs=[{
    "machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
    "python_package_spec": {"executor_image_uri": sys.argv[3], "package_uris": [package],
                            "python_module": "benchtrainer.task"}}])
job.run(sync=True)
assert job.state.name == "JOB_STATE_SUCCEEDED", job.state
"""


def bench_vertex(b: Bench) -> list[Row]:
    rest = Row("14a", "Vertex custom job (one replica) create -> SUCCEEDED", "aiplatform v1 customJobs.create + get",
               "ml v1 jobs.create + get (BASIC, same trainer)", "<=1.2x")
    sdk = Row("14b", "the SDK's CustomJob.run() of that job", "google-cloud-aiplatform CustomJob.run()",
              "customJobs.create + get every 0.1 s", "")
    home = b.new_home()
    environment = {**os.environ, "AIPTRAIN_HOME": str(home), "AIPTRAIN_GCS": "local"}
    environment.pop("AIPTRAIN_STAGING_BUCKET", None)
    server = subprocess.Popen([*b.aiptrain_cmd, "serve", "--port", "0"], env=environment, stderr=subprocess.PIPE,
                              text=True)
    try:
        url = _served_url(server)
        package = _stage(home, b.build_sdist())

        def vertex(i: int) -> None:
            rest.ours.append(_run(url, f"/v1/projects/{PROJECT}/locations/us-central1/customJobs",
                                  _custom_job(package), "JOB_STATE_SUCCEEDED"))

        def ml(i: int) -> None:
            job_id = b.job_id("ml")
            b.jobs.append((job_id, home))
            rest.base.append(_run(url, f"/v1/projects/{PROJECT}/jobs", _ml_job(job_id, package), "SUCCEEDED"))

        warm = b.job_id("warm")
        b.jobs.append((warm, home))
        _run(url, f"/v1/projects/{PROJECT}/jobs", _ml_job(warm, package), "SUCCEEDED")  # installs once, untimed
        interleaved(b.args.repeat, vertex, ml)
        python = _python_with_sdk()
        if python is None:
            sdk.skipped = "google-cloud-aiplatform is not installed (`make install` puts it in .venv)"
        else:
            run_sdk = [python, "-c", SDK_RUN, url, package, EXECUTOR]
            interleaved(b.args.repeat, lambda i: sdk.ours.append(timed(run_sdk, env=environment)[0]),
                        lambda i: sdk.base.append(rest.ours[i % len(rest.ours)]))
    finally:
        server.terminate()
        server.wait(timeout=30)
    return [rest, sdk]


def _stage(home: Path, sdist: Path) -> str:
    """The sdist in the server's Cloud Storage (AIPTRAIN_GCS=local keeps it under the home)."""
    target = home / "gcs" / BUCKET / "packages" / sdist.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sdist, target)
    return f"gs://{BUCKET}/packages/{sdist.name}"


def _custom_job(package: str) -> dict:
    return {"displayName": "bench", "jobSpec": {"workerPoolSpecs": [{
        "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
        "pythonPackageSpec": {"executorImageUri": EXECUTOR, "packageUris": [package],
                              "pythonModule": "benchtrainer.task"}}]}}


def _ml_job(job_id: str, package: str) -> dict:
    return {"jobId": job_id, "trainingInput": {"scaleTier": "BASIC", "packageUris": [package], "region": "us-central1",
                                               "pythonModule": "benchtrainer.task", "runtimeVersion": "2.11"}}


def _call(url: str, method: str, path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        raise BenchError(f"{method} {path}: {error.code} {error.read().decode(errors='replace')[:300]}") from None


def _run(url: str, collection: str, body: dict, succeeded: str) -> float:
    """Seconds from the create to the state `succeeded`, polling get every POLL_SECONDS."""
    start = time.perf_counter()
    created = _call(url, "POST", collection, body)
    path = f"/v1/{created['name']}" if "name" in created else f"{collection}/{created['jobId']}"
    deadline = start + 300
    while time.perf_counter() < deadline:
        state = _call(url, "GET", path).get("state", "")
        if state == succeeded:
            return time.perf_counter() - start
        if state.rsplit("_", 1)[-1] in ("FAILED", "CANCELLED"):
            raise BenchError(f"{path} ended {state}")
        time.sleep(POLL_SECONDS)
    raise BenchError(f"{path} did not end within 300 s")


def _python_with_sdk() -> str | None:
    repo_python = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python"
    for python in (sys.executable, str(repo_python)):
        if Path(python).exists() and subprocess.run([python, "-c", "import google.cloud.aiplatform"],
                                                    capture_output=True).returncode == 0:
            return python
    return None

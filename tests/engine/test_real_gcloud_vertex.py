"""Google's real gcloud (the one on PATH) running Vertex AI custom jobs on `aiptrain serve`, set up
by `aiptrain gcloud-config` alone: `gcloud ai custom-jobs create|describe|list|cancel|stream-logs`
with container and Python-package pools, a --config file, labels and several pools; the lines
scripts parse; refusals as gcloud prints the service's; and gcloud's autopackaging
(`local-package-path`), which builds an image and stops at `docker push` (no registry here).

gcloud's stream-logs asks whether the job ended once, when it starts (api_lib/ai/custom_jobs/
client.py `CheckJobComplete`): it ends only for a job that had ended by then, so it is run here on
ended jobs. Tiny jobs; with CI=true a missing gcloud or image fails."""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
import urllib.request

from conftest import SAMPLE_TRAINER, require_image, runtime_image
from test_real_gcloud import PROJECT, gcloud, server  # noqa: F401 (fixtures)

REGION = ("--region", "us-central1")
# What `gcloud ai custom-jobs create` prints (surface/ai/custom_jobs/create.py) and scripts parse.
SUBMITTED = re.compile(r"^CustomJob \[(projects/[^/]+/locations/[^/]+/customJobs/(\d+))\] is submitted successfully\.$",
                       re.M)
ENDED = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")
PREBUILT_TF = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-11.py310:latest"  # runs on runtime 2.11


def create(gcloud, *args: str) -> tuple[str, str]:  # noqa: F811
    """`gcloud ai custom-jobs create ARGS`: the job's name and numeric ID, read from the line it prints."""
    result = gcloud("ai", "custom-jobs", "create", *REGION, *args)
    found = SUBMITTED.search(result.stderr)
    assert found, result.stderr
    return found.group(1), found.group(2)


def describe(gcloud, numeric: str) -> dict:  # noqa: F811
    return json.loads(gcloud("ai", "custom-jobs", "describe", numeric, *REGION, "--format=json").stdout)


def wait_for(gcloud, numeric: str, states: tuple[str, ...] = ENDED, seconds: float = 180) -> dict:  # noqa: F811
    deadline = time.monotonic() + seconds
    while (job := describe(gcloud, numeric))["state"] not in states and time.monotonic() < deadline:
        time.sleep(0.5)
    return job


def stream_logs(gcloud, numeric: str, *args: str) -> list[list[str]]:  # noqa: F811
    """The lines of an ended job's `stream-logs`, each as its fields (severity, time, task, message)."""
    out = gcloud("ai", "custom-jobs", "stream-logs", numeric, *REGION, "--polling-interval", "1", *args).stdout
    return [line.split("\t") for line in out.splitlines()]


def entries(url: str, numeric: str) -> list[dict]:
    """The job's entries, straight from the server's Cloud Logging API."""
    body = {"resourceNames": [f"projects/{PROJECT}"], "filter": f'resource.labels.job_id="{numeric}"'}
    request = urllib.request.Request(f"{url}/v2/entries:list", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read()).get("entries", [])


def test_a_container_job_runs_and_streams_as_gcloud_prints_it(gcloud, minimal_runtime):  # noqa: F811
    image = runtime_image(minimal_runtime)
    name, numeric = create(gcloud, "--display-name", "hello", "--labels", "team=ml,stage=a",
                           f"--worker-pool-spec=machine-type=n1-standard-4,replica-count=1,container-image-uri={image}",
                           "--command=python3,-c", "--args=import os; print('hello ' + os.environ['CLOUD_ML_JOB_ID'])")
    assert name == f"projects/{PROJECT}/locations/us-central1/customJobs/{numeric}"
    job = wait_for(gcloud, numeric)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    assert (job["name"], job["displayName"], job["labels"]) == (name, "hello", {"team": "ml", "stage": "a"})
    pool = job["jobSpec"]["workerPoolSpecs"][0]
    assert pool["containerSpec"]["command"] == ["python3", "-c"] and pool["replicaCount"] == "1"
    assert describe(gcloud, name)["name"] == name  # the full name works as well as the ID and --region

    lines = stream_logs(gcloud, numeric)
    assert ["workerpool0-0", f"hello {numeric}"] in [line[2:] for line in lines], lines
    assert ["service", "Job completed successfully."] in [line[2:] for line in lines], lines
    assert all(line[0] in ("INFO", "WARNING", "ERROR") and len(line) == 4 for line in lines), lines


def test_pools_from_a_config_file_list_cancel_and_stream_one_task(gcloud, server, minimal_runtime, tmp_path):  # noqa: F811
    image = runtime_image(minimal_runtime)
    gcloud("storage", "buckets", "create", "gs://vertex-pools")
    sleeper = "import os, time; print('{} up', os.environ['CLUSTER_SPEC'], flush=True); time.sleep(600)"
    spec = {"workerPoolSpecs": [
        {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": 1,
         "containerSpec": {"imageUri": image, "command": ["python3", "-c"], "args": [sleeper.format("chief")]}},
        {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": 1,
         "containerSpec": {"imageUri": image, "command": ["python3", "-c"], "args": [sleeper.format("worker")]}},
    ], "baseOutputDirectory": {"outputUriPrefix": "gs://vertex-pools/long"}}
    (tmp_path / "spec.yaml").write_text(json.dumps(spec))  # YAML, as JSON is
    name, long = create(gcloud, "--display-name", "long", "--labels", "stage=long", "--config",
                        str(tmp_path / "spec.yaml"))
    _, short = create(gcloud, "--display-name", "short", "--labels", "stage=short",
                      f"--worker-pool-spec=machine-type=n1-standard-4,container-image-uri={image}", "--command=true")

    listed = gcloud("ai", "custom-jobs", "list", *REGION, "--filter", "labels.stage=long", "--format=value(name)")
    assert listed.stdout.split() == [name]
    newest = gcloud("ai", "custom-jobs", "list", *REGION, "--sort-by", "~createTime", "--limit", "1",
                    "--format=value(displayName)")
    assert newest.stdout.split() == ["short"]
    assert "Listed 0 items." in gcloud("ai", "custom-jobs", "list", "--region", "europe-west4").stderr

    assert wait_for(gcloud, long, ("JOB_STATE_RUNNING", *ENDED))["state"] == "JOB_STATE_RUNNING"
    deadline = time.monotonic() + 60
    while len({e["resource"]["labels"]["task_name"] for e in entries(server, long)} - {"service"}) < 2 \
            and time.monotonic() < deadline:  # both replicas said they are up
        time.sleep(0.5)
    cancelled = gcloud("ai", "custom-jobs", "cancel", long, *REGION)
    assert f"Request to cancel CustomJob [{name}] has been sent." in cancelled.stderr
    job = wait_for(gcloud, long)
    assert job["state"] == "JOB_STATE_CANCELLED" and job["error"]["code"] == 1, job
    assert wait_for(gcloud, short)["state"] == "JOB_STATE_SUCCEEDED"

    worker = stream_logs(gcloud, long, "--task-name", "workerpool1-0")
    assert {line[2] for line in worker} == {"workerpool1-0"}, worker
    spec_seen = json.loads(worker[0][3].removeprefix("worker up "))
    assert spec_seen["task"] == {"type": "workerpool1", "index": 0} and set(spec_seen["cluster"]) == {
        "workerpool0", "workerpool1"}


def sdist(path, name: str = "trainer", version: str = "0.1") -> None:
    """A source distribution of the sample trainer, as `python setup.py sdist` makes one."""
    root = f"{name}-{version}"
    files = {f"{root}/setup.py": f"from setuptools import setup\nsetup(name='{name}', version='{version}', "
                                 "packages=['trainer'])\n",
             f"{root}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"}
    for source in sorted(SAMPLE_TRAINER.glob("*.py")):
        files[f"{root}/trainer/{source.name}"] = source.read_text()
    with tarfile.open(path, "w:gz") as archive:
        for member, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(member)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def test_a_python_package_uploaded_with_gcloud_storage_runs_on_a_prebuilt_image(gcloud, docker_api, tmp_path):  # noqa: F811
    require_image(docker_api, runtime_image("2.11"))
    sdist(tmp_path / "trainer-0.1.tar.gz")
    gcloud("storage", "buckets", "create", "gs://vertex-pkg")
    gcloud("storage", "cp", str(tmp_path / "trainer-0.1.tar.gz"), "gs://vertex-pkg/packages/")
    _, numeric = create(gcloud, "--display-name", "package", "--python-package-uris",
                        "gs://vertex-pkg/packages/trainer-0.1.tar.gz",
                        "--worker-pool-spec=machine-type=n1-standard-4,replica-count=1,"
                        f"executor-image-uri={PREBUILT_TF},python-module=trainer.task",
                        "--args=--steps=3,--job-dir=/gcs/vertex-pkg/out")  # the bucket, as Vertex mounts it
    job = wait_for(gcloud, numeric)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    package = job["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]
    assert package == {"executorImageUri": PREBUILT_TF, "packageUris": ["gs://vertex-pkg/packages/trainer-0.1.tar.gz"],
                       "pythonModule": "trainer.task", "args": ["--steps=3", "--job-dir=/gcs/vertex-pkg/out"]}
    assert "weight" in gcloud("storage", "cat", "gs://vertex-pkg/out/model.json").stdout


def test_refusals_read_as_gcloud_prints_the_service_s_and_create_nothing(gcloud):  # noqa: F811
    missing = gcloud("ai", "custom-jobs", "describe", "123", *REGION, check=False)
    assert missing.returncode == 1
    assert ("ERROR: (gcloud.ai.custom-jobs.describe) NOT_FOUND: The CustomJob does not exist: "
            f"projects/{PROJECT}/locations/us-central1/customJobs/123.") in missing.stderr, missing.stderr
    two_chiefs = gcloud("ai", "custom-jobs", "create", *REGION, "--display-name", "bad",
                        "--worker-pool-spec=machine-type=n1-standard-4,replica-count=2,container-image-uri=any:1",
                        check=False)
    assert two_chiefs.returncode == 1
    assert ("ERROR: (gcloud.ai.custom-jobs.create) INVALID_ARGUMENT: jobSpec.workerPoolSpecs[0].replicaCount must "
            "be 1: the primary pool runs one replica; put the others in workerPoolSpecs[1].") in two_chiefs.stderr
    not_prebuilt = gcloud("ai", "custom-jobs", "create", *REGION, "--display-name", "bad", "--python-package-uris",
                          "gs://b/p.tar.gz", "--worker-pool-spec=machine-type=n1-standard-4,"
                          "executor-image-uri=python:3.11,python-module=trainer.task", check=False)
    assert not_prebuilt.returncode == 1
    assert ("ERROR: (gcloud.ai.custom-jobs.create) INVALID_ARGUMENT: jobSpec.workerPoolSpecs[0].pythonPackageSpec."
            "executorImageUri [python:3.11] is not one of "
            "Vertex AI's prebuilt training images") in not_prebuilt.stderr, not_prebuilt.stderr
    assert "Listed 0 items." in gcloud("ai", "custom-jobs", "list", *REGION).stderr


def test_autopackaging_builds_the_image_and_stops_at_docker_push_creating_nothing(gcloud, docker_api,  # noqa: F811
                                                                                 minimal_runtime, tmp_path):
    """`local-package-path` makes gcloud `docker build` an image FROM executor-image-uri and `docker
    push` it to gcr.io/PROJECT/cloudai-autogenerated/NAME:TAG (or to output-image-uri, which must be on
    gcr.io or a *-docker.pkg.dev host) before it sends the create: with no registry to push to, it
    stops there (docs/guide/real-gcloud.md says what to run instead)."""
    package = tmp_path / "source"
    (package / "trainer").mkdir(parents=True)
    for source in SAMPLE_TRAINER.glob("*.py"):
        (package / "trainer" / source.name).write_text(source.read_text())
    repository = f"gcr.io/{PROJECT}/cloudai-autogenerated/autopackaged"
    try:
        result = gcloud("ai", "custom-jobs", "create", *REGION, "--display-name", "autopackaged",
                        "--worker-pool-spec=machine-type=n1-standard-4,replica-count=1,"
                        f"executor-image-uri={runtime_image(minimal_runtime)},local-package-path={package},"
                        "python-module=trainer.task", check=False, timeout=300)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "A custom container image is built locally." in result.stderr, result.stderr
        assert re.search(rf"Docker failed with error code \d+\.\s+Command: docker push {re.escape(repository)}:",
                         result.stderr), result.stderr
        assert "Listed 0 items." in gcloud("ai", "custom-jobs", "list", *REGION).stderr
    finally:
        for image in docker_api.images(name=repository):
            docker_api.remove_image(image["Id"], force=True)

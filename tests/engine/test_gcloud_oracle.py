"""The real gcloud is the oracle for aiptrain's command line: each published command line of
gcloud_command_lines.yaml (with its --config file) is submitted twice to one installation, once
by Google's gcloud through `aiptrain serve` and once by `aiptrain jobs submit training`, and the
two Jobs the store records must be the same, field by field. Where gcloud 528 refuses a line
before sending it, aiptrain takes it (the service did, from older gcloud releases) with one
warning line; where the server refuses what gcloud sent, aiptrain refuses the same line.

No job runs: the test holds the home's controller lock and the one replica slot, so both records
stay QUEUED. Every image a line names is the minimal runtime's, tagged for the test under
AIPTRAIN_IMAGE_REPOSITORY, and GPU lines are recorded as on an engine with the NVIDIA runtime
(the records are what is compared; running each runtime, or GPUs, is other tests' work)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from aiptrain.codeversion import code_version
from aiptrain.ownership import JobLock
from aiptrain.settings import Settings

from conftest import (
    SAMPLE_TRAINER,
    remove_jobs_left_running,
    remove_shared_engine_resources,
    require_image,
    runtime_image,
)
from test_real_gcloud import PROJECT, configured_gcloud, serving

LINES = yaml.safe_load((Path(__file__).with_name("gcloud_command_lines.yaml")).read_text())
BUCKET = "oracle-b"
ORACLE_REPOSITORY = "aiptrain-oracle/runtime"
# What the two records may differ in: who named them and when, and where each put the package
# (gcloud stages to STAGING/JOB/DIGEST/, aiptrain to its own place; the file names must agree).
UNCOMPARED = ("jobId", "createTime", "etag", "state", "startTime", "endTime", "trainingOutput", "jobPosition",
              "errorMessage")


def substituted(text: str, package_path: str, config_path: str) -> str:
    return (text.replace("{package_path}", package_path).replace("{config}", config_path)
            .replace("{bucket}", BUCKET))


def runtime_versions(line: dict) -> set[str]:
    """The runtime versions a line names, on the command line or in its config."""
    found = set()
    argv = line["argv"]
    for index, token in enumerate(argv):
        if token == "--":
            break
        if token.startswith("--runtime-version="):
            found.add(token.partition("=")[2])
        elif token == "--runtime-version" and index + 1 < len(argv):
            found.add(argv[index + 1])
    found |= set(re.findall(r"runtimeVersion\"?\s*:\s*[\"']?([0-9.]+)", line.get("config") or ""))
    return found


def images_named(line: dict) -> set[str]:
    """The container images a line names (--*-image-uri flags, imageUri in its config)."""
    text = " ".join(line["argv"][:line["argv"].index("--")] if "--" in line["argv"] else line["argv"])
    text += "\n" + (line.get("config") or "")
    return {uri.strip("'\"") for uri in re.findall(r"(?:image-uri[= ]|imageUri\"?\s*:\s*)[\"']?([^\s,\"'}]+)", text)}


@pytest.fixture(scope="module")
def oracle_images(docker_api):
    """Every runtime version and image the lines name, as the minimal runtime's image."""
    require_image(docker_api, runtime_image("minimal"))
    source = runtime_image("minimal")
    tags = {f"{ORACLE_REPOSITORY}:{version}" for line in LINES for version in runtime_versions(line)}
    tags |= {f"{ORACLE_REPOSITORY}:minimal"} | {image for line in LINES for image in images_named(line)}
    made = []
    for tag in sorted(tags):
        repository, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
        try:
            docker_api.inspect_image(tag)
        except Exception:  # noqa: BLE001 - not there: the test's own tag
            docker_api.tag(source, repository, version)
            made.append(tag)
    yield
    for tag in made:
        docker_api.remove_image(tag, noprune=True)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory, oracle_images):
    """One home for every line (each line's jobs have IDs of their own), its `aiptrain serve`
    and the real gcloud pointed at it. Recorded jobs stay QUEUED: the home's controller lock is
    held by the test (with this code's version, so a submit starts none), and the machine's one
    replica slot (AIPTRAIN_MAX_RUNNING_REPLICAS=1) by a job of the test's, so admission queues
    the rest and a submit returns at once."""
    from aiptrain import admission
    from aiptrain.backends.engine import Engine
    from aiptrain.client import Client
    from aiptrain.model import Job

    workdir = tmp_path_factory.mktemp("oracle")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AIPTRAIN_STAGING_BUCKET", "AIPTRAIN_STORE", "AIPTRAIN_API", "CLOUDSDK_COMPUTE_REGION"):
            patch.delenv(name, raising=False)
        for name, value in {"AIPTRAIN_HOME": str(workdir / "home"), "AIPTRAIN_DEFAULT_RUNTIME": "minimal",
                            "AIPTRAIN_GCS": "local", "CLOUDSDK_CORE_PROJECT": PROJECT,
                            "AIPTRAIN_IMAGE_REPOSITORY": ORACLE_REPOSITORY, "AIPTRAIN_AUTO_BUILD": "0",
                            "AIPTRAIN_MAX_RUNNING_REPLICAS": "1"}.items():
            patch.setenv(name, value)
        # What is compared is the record; no job runs. So lines that ask for GPUs are recorded
        # here as on an engine with the NVIDIA runtime, instead of both sides refusing them alike.
        patch.setattr(Engine, "has_gpu_runtime", lambda self: True)
        settings = Settings()
        settings.ensure_dirs()
        lock = JobLock.try_acquire(settings.controller_lock_path)
        assert lock is not None
        settings.controller_state_path.write_text(json.dumps(
            {"pid": os.getpid(), "version": code_version(), "started": datetime.now(timezone.utc).isoformat()}))
        holder = Job.model_validate({"jobId": "slot_holder", "trainingInput": {
            "scaleTier": "BASIC", "region": "us-central1", "pythonModule": "m", "packageUris": ["gs://b/p.tar.gz"]}})
        with Client() as client:
            assert admission.request(client.store, "slot_holder", client.store.create(holder, backend="docker"), 1).admitted
        for line in LINES:  # the sdists that `--packages gs://BUCKET/.../NAME-VERSION.tar.gz` lines name
            for uri in re.findall(r"gs://\{bucket\}/[^\s,]+\.tar\.gz", " ".join(line["argv"])):
                target = settings.gcs_root / BUCKET / uri.split("/", 3)[3]
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(empty_sdist(target.name, workdir / "sdists"), target)
        (settings.gcs_root / BUCKET).mkdir(parents=True, exist_ok=True)
        try:
            with serving() as url:
                yield configured_gcloud(url, workdir)
        finally:
            settings.controller_state_path.unlink()
            lock.release()
            for thread in threading.enumerate():  # a submit starts the storage endpoint beside its packaging
                if getattr(thread, "_target", None) is not None and thread._target.__name__ == "_get_ready":
                    thread.join(60)
            remove_jobs_left_running(settings.installation_id)
            remove_shared_engine_resources(workdir)


def empty_sdist(file_name: str, workdir: Path) -> Path:
    """An installable sdist of the project `file_name` (NAME-VERSION.tar.gz, else NAME.tar.gz) names,
    holding no code: packages that lines list side by side must not be one project thrice."""
    stem = file_name.removesuffix(".tar.gz")
    name, _, version = stem.rpartition("-") if "-" in stem else (stem, "", "0.0")
    source, dist = workdir / stem, workdir / stem / "dist"
    source.mkdir(parents=True, exist_ok=True)
    (source / "setup.py").write_text(f"from setuptools import setup\nsetup(name={name!r}, version={version!r})\n")
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(dist)], cwd=source, check=True,
                   capture_output=True)
    return next(dist.glob("*.tar.gz"))


def without_streaming(argv: list[str]) -> list[str]:
    """The line without --stream-logs (the jobs never run here; the record is the same)."""
    end = argv.index("--") if "--" in argv else len(argv)
    return [token for token in argv[:end] if token != "--stream-logs"] + argv[end:]


def comparable(resource: dict) -> dict:
    job = {key: value for key, value in resource.items() if key not in UNCOMPARED}
    training = dict(job.get("trainingInput") or {})
    if "packageUris" in training:
        training["packageUris"] = sorted(uri.rsplit("/", 1)[-1] for uri in training["packageUris"])
    job["trainingInput"] = training
    return job


def differences(gcloud_job: object, aiptrain_job: object, path: str = "") -> list[str]:
    """`path: gcloud's value != aiptrain's` for each field where the two records differ."""
    if isinstance(gcloud_job, dict) and isinstance(aiptrain_job, dict):
        return [line for key in sorted(set(gcloud_job) | set(aiptrain_job))
                for line in differences(gcloud_job.get(key), aiptrain_job.get(key), f"{path}.{key}".lstrip("."))]
    if gcloud_job != aiptrain_job:
        return [f"{path}: gcloud {json.dumps(gcloud_job)} != aiptrain {json.dumps(aiptrain_job)}"]
    return []


def recorded(job_id: str) -> dict | None:
    from aiptrain.client import Client

    with Client() as client:
        return client.get(job_id).to_resource() if client.store.key_of(client.project, job_id) else None


def aiptrain(*argv: str) -> tuple[int, str]:
    """`aiptrain ARGV` in this process: (exit status, stderr)."""
    from aiptrain.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as ended:
        main(list(argv))
    return ended.value.code, err.getvalue()


# What the server answered, as gcloud prints it: `ERROR: (gcloud.COMMAND) STATUS: message`.
SERVER_REFUSAL = re.compile(r"\) (?:INVALID_ARGUMENT|NOT_FOUND|ALREADY_EXISTS|PERMISSION_DENIED|FAILED_PRECONDITION|"
                            r"UNAVAILABLE|INTERNAL|UNAUTHENTICATED): |HttpError accessing")


@pytest.mark.parametrize("index, line", list(enumerate(LINES)), ids=[line["id"] for line in LINES])
def test_gcloud_and_aiptrain_record_the_same_job(index, line, oracle, tmp_path):
    config_path = tmp_path / "config.yaml"
    if line.get("config") is not None:
        config_path.write_text(substituted(line["config"], str(SAMPLE_TRAINER), str(config_path)))
    argv = [substituted(token, str(SAMPLE_TRAINER), str(config_path)) for token in without_streaming(line["argv"])]
    command = [*([line["track"]] if line["track"] else []), line["surface"], "jobs", "submit", "training"]
    by_gcloud = oracle(*command, f"by_gcloud_{index}", *argv, check=False, timeout=120)
    code, err = aiptrain(*command, f"by_aiptrain_{index}", *argv)
    from_gcloud, from_aiptrain = recorded(f"by_gcloud_{index}"), recorded(f"by_aiptrain_{index}")
    if from_gcloud is not None:
        assert code == 0 and from_aiptrain is not None, f"gcloud's job was recorded, aiptrain refused: {err}"
        assert differences(comparable(from_gcloud), comparable(from_aiptrain)) == []
    elif SERVER_REFUSAL.search(by_gcloud.stderr):  # the server refused what gcloud sent: so does the CLI
        assert code != 0 and from_aiptrain is None, f"the server refused gcloud's request, aiptrain took it:\n" \
                                                    f"{by_gcloud.stderr}"
    elif line.get("refused_by_every_gcloud"):  # gcloud 528 refused it before sending, as older releases did
        assert code == 2 and from_aiptrain is None, err
    else:  # gcloud 528 refused before sending what older releases sent, and the service took
        assert code == 0 and from_aiptrain is not None, f"aiptrain refused [{err}]; gcloud: {by_gcloud.stderr}"
        assert "WARNING: gcloud 528 would refuse this command line" in err, err

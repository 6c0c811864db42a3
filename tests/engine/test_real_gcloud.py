"""Google's real gcloud (the one on PATH, never a stand-in) against `aiptrain serve`, set up by
`aiptrain gcloud-config` alone: the AI Platform workflow, Cloud Storage through `gcloud storage`
and gsutil, and refusals as gcloud prints the service's. With CI=true a missing gcloud fails.

gcloud runs with a configuration directory of the test's own (CLOUDSDK_CONFIG), so nothing of
this machine's gcloud set-up is read or changed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from aiptrain.api.access import Access, load_tokens
from aiptrain.api.app import App
from aiptrain.api.server import make_server
from aiptrain.settings import Settings

from conftest import IN_CI, SAMPLE_TRAINER

GCLOUD = shutil.which("gcloud")
PROJECT = "gcloud-tests"


def require_gcloud() -> str:
    if GCLOUD is None:
        reason = "Google's gcloud is not on PATH (the google-cloud-cli package): the real-gcloud tests did not run"
        if IN_CI:
            pytest.fail(f"{reason} (CI=true: they must run)")
        pytest.skip(reason)
    return GCLOUD


@contextmanager
def serving(access: Access | None = None):
    """`aiptrain serve` of the current home on a free loopback port: its URL."""
    server = make_server(App(Settings(), access), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def server(home, monkeypatch):
    monkeypatch.setenv("AIPTRAIN_GCS", "local")
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", PROJECT)
    with serving() as url:
        yield url


def gcloud_environment(config_dir: Path) -> dict[str, str]:
    """gcloud's environment: its own configuration directory, no prompts, no update check or
    usage report (nothing leaves this machine)."""
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("CLOUDSDK_", "BOTO_", "AIPTRAIN_API"))}
    return {**environment, "CLOUDSDK_CONFIG": str(config_dir), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
            "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true"}


def configured_gcloud(url: str, workdir: Path, *options: str, project: str = PROJECT):
    """run(*args, check=True) -> CompletedProcess of the real gcloud, pointed at `url` by
    `aiptrain gcloud-config [OPTIONS]` (in a configuration directory of its own under `workdir`)."""
    binary = require_gcloud()
    config_dir = workdir / "gcloud-config"
    environment = gcloud_environment(config_dir)
    made = subprocess.run([sys.executable, "-m", "aiptrain", "gcloud-config", "--url", url, "--project", project,
                           *options], env=environment, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    (config_dir / "gce").write_text("False")  # gcloud's own cache: this is no GCE machine, no need to look

    def run(*args: str, check: bool = True, timeout: float = 180, tool: str = binary) -> subprocess.CompletedProcess:
        result = subprocess.run([tool, *args], env=environment, capture_output=True, text=True, timeout=timeout,
                                cwd=workdir)
        if check:
            assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result

    return run


@pytest.fixture
def gcloud(server, tmp_path):
    return configured_gcloud(server, tmp_path)


def gsutil_of(gcloud_binary: str) -> str:
    """The gsutil of the same Cloud SDK as this gcloud."""
    return str(Path(os.path.realpath(gcloud_binary)).with_name("gsutil"))


def describe(gcloud, job_id: str) -> dict:
    return json.loads(gcloud("ai-platform", "jobs", "describe", job_id, "--format=json").stdout)


def test_gcloud_config_writes_a_named_configuration_and_default_goes_back(gcloud, server):
    listed = json.loads(gcloud("config", "configurations", "list", "--format=json").stdout)
    active = {c["name"]: c for c in listed}
    assert active["aiptrain"]["is_active"] and "default" in active
    properties = active["aiptrain"]["properties"]
    assert {k: v for k, v in properties["api_endpoint_overrides"].items() if v} == {"ml": f"{server}/", "logging": f"{server}/",
                                                    "storage": f"{server}/storage/v1/", "aiplatform": f"{server}/"}
    assert properties["ml_engine"]["polling_interval"] == "1" and properties["core"]["project"] == PROJECT
    for prop, value in (("api_endpoint_overrides/storage", f"{server}/storage/v1/"),
                        ("api_endpoint_overrides/logging", f"{server}/"), ("auth/disable_credentials", "False")):
        assert gcloud("config", "get-value", prop).stdout.strip() == value, prop  # as gcloud itself reads them
    gcloud("config", "configurations", "activate", "default")
    assert gcloud("config", "get-value", "api_endpoint_overrides/ml").stdout.strip() == ""


def test_the_most_common_submit_uploads_with_gcloud_runs_and_streams_to_the_end(gcloud, minimal_runtime):
    gcloud("storage", "buckets", "create", "gs://staging-b")
    started = time.monotonic()
    result = gcloud("ai-platform", "jobs", "submit", "training", "census_1", "--package-path", str(SAMPLE_TRAINER),
                    "--module-name", "trainer.task", "--staging-bucket", "gs://staging-b", "--job-dir",
                    "gs://staging-b/census_1", "--region", "us-central1", "--runtime-version", minimal_runtime,
                    "--labels", "team=ml,owner=ci", "--stream-logs", "--", "--steps", "10")
    elapsed = time.monotonic() - started
    assert "state: SUCCEEDED" in result.stdout, result.stdout + result.stderr
    assert re.search(r"master-replica-0\s+Wrote model to gs://staging-b/census_1/model.json", result.stderr), result.stderr
    job = describe(gcloud, "census_1")
    assert job["state"] == "SUCCEEDED" and job["labels"] == {"team": "ml", "owner": "ci"}
    package = job["trainingInput"]["packageUris"][0]
    assert re.fullmatch(r"gs://staging-b/census_1/[0-9a-f]+/trainer-0\.0\.0\.tar\.gz", package), package
    assert package in gcloud("storage", "ls", "-r", "gs://staging-b/census_1/").stdout
    assert elapsed < 60  # a sanity bound, not a timing target: gcloud's default polling would take a minute


# --filter expressions as scripts write them; gcloud evaluates them itself on what the server lists.
FILTERS = ("labels.stage=done", "state=SUCCEEDED", "state:RUNNING OR state:QUEUED", "jobId:short*",
           "NOT labels.stage:*", "createTime>2020-01-01", "trainingInput.region=us-central1 AND state!=SUCCEEDED")


def test_jobs_verbs_list_update_stream_logs_and_cancel(gcloud, run, minimal_runtime):
    gcloud("storage", "buckets", "create", "gs://verbs-b")
    common = ("--module-name", "trainer.task", "--staging-bucket", "gs://verbs-b", "--region", "us-central1",
              "--runtime-version", minimal_runtime)
    gcloud("ai-platform", "jobs", "submit", "training", "short_1", "--package-path", str(SAMPLE_TRAINER), *common,
           "--job-dir", "gs://verbs-b/short_1", "--async", "--", "--steps", "5")
    package = describe(gcloud, "short_1")["trainingInput"]["packageUris"][0]
    gcloud("ai-platform", "jobs", "submit", "training", "long_1", "--packages", package, *common,
           "--job-dir", "gs://verbs-b/long_1", "--", "--steps", "100000", "--sleep", "0.01")
    streamed = gcloud("ai-platform", "jobs", "stream-logs", "short_1", "--task-name", "master-replica-0",
                      "--allow-multiline-logs", "--polling-interval", "1")
    assert "Starting chief 0: 5 steps" in streamed.stdout and describe(gcloud, "short_1")["state"] == "SUCCEEDED"

    gcloud("ai-platform", "jobs", "update", "short_1", "--update-labels", "stage=done")
    assert describe(gcloud, "short_1")["labels"] == {"stage": "done"}
    listed = json.loads(gcloud("ai-platform", "jobs", "list", "--filter", "labels.stage=done", "--format=json").stdout)
    assert [job["jobId"] for job in listed] == ["short_1"]
    for expression in FILTERS:  # gcloud filters on the client what the server lists: aiptrain's own CLI agrees
        ours = run("jobs", "list", "--filter", expression, "--format=value(jobId)")
        theirs = gcloud("ai-platform", "jobs", "list", "--filter", expression, "--format=value(jobId)").stdout
        assert ours[0] == 0 and sorted(ours[1].split()) == sorted(theirs.split()), (expression, ours, theirs)
    newest = gcloud("ai-platform", "jobs", "list", "--sort-by", "~createTime", "--limit", "1", "--page-size", "1",
                    "--format=value(jobId)").stdout.split()
    assert newest == ["long_1"]
    # gcloud's `ai-platform jobs list` registers no URI function: --uri prints nothing, whatever the server holds.
    assert gcloud("ai-platform", "jobs", "list", "--uri").stdout == ""

    gcloud("ai-platform", "jobs", "cancel", "long_1")
    deadline = time.monotonic() + 60
    while describe(gcloud, "long_1")["state"] not in ("CANCELLED", "FAILED", "SUCCEEDED") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert describe(gcloud, "long_1")["state"] == "CANCELLED"


def test_refusals_read_as_gcloud_prints_the_services(gcloud):
    missing = gcloud("ai-platform", "jobs", "describe", "no_such_job", check=False)
    assert missing.returncode == 1, missing.stderr
    assert "ERROR: (gcloud.ai-platform.jobs.describe) NOT_FOUND: Job [no_such_job] not found" in missing.stderr
    taken = gcloud("ai-platform", "jobs", "submit", "training", "Bad-Name", "--packages", "gs://refused-b/p.tar.gz",
                   "--module-name", "m", "--region", "us-central1", check=False)
    assert taken.returncode == 1, taken.stderr
    assert "ERROR: (gcloud.ai-platform.jobs.submit.training) INVALID_ARGUMENT: Invalid job ID [Bad-Name]" in taken.stderr
    # Models and versions: gcloud sends them to a regional host (us-central1-HOST) unless --region global.
    models = gcloud("ai-platform", "models", "list", "--region", "global", check=False)
    assert models.returncode == 1, models.stderr
    assert "Models and versions (prediction) are not served by aiptrain" in models.stderr, models.stderr


def test_gcloud_storage_and_gsutil_against_the_server(gcloud, tmp_path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("alpha\n")
    (data / "sub" / "b.bin").write_bytes(bytes(range(256)) * 40)
    gcloud("storage", "buckets", "create", "gs://store-b")
    gcloud("storage", "cp", "-r", str(data), "gs://store-b/")
    assert sorted(gcloud("storage", "ls", "-r", "gs://store-b/**").stdout.split()) == [
        "gs://store-b/data/a.txt", "gs://store-b/data/sub/b.bin"]
    assert gcloud("storage", "cat", "gs://store-b/data/a.txt").stdout == "alpha\n"
    assert "10246" in gcloud("storage", "du", "-s", "gs://store-b").stdout
    gcloud("storage", "cp", "gs://store-b/data/sub/b.bin", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == (data / "sub" / "b.bin").read_bytes()
    gcloud("storage", "rm", "gs://store-b/data/a.txt")
    assert gcloud("storage", "ls", "gs://store-b/data/").stdout.split() == ["gs://store-b/data/sub/"]

    # Above 8 MiB gcloud uploads resumably (under /resumable/upload/); above the threshold set
    # here, in parallel pieces that it composes and deletes (150 MiB by default).
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(9 << 20))
    gcloud("storage", "cp", str(big), "gs://store-b/big.bin")
    gcloud("config", "set", "storage/parallel_composite_upload_threshold", "4M")
    gcloud("config", "set", "storage/parallel_composite_upload_enabled", "True")
    gcloud("storage", "cp", str(big), "gs://store-b/composed.bin")
    for name in ("big.bin", "composed.bin"):
        gcloud("storage", "cp", f"gs://store-b/{name}", str(tmp_path / f"back-{name}"))
        assert (tmp_path / f"back-{name}").read_bytes() == big.read_bytes()
    assert "parallel_composite_uploads" not in gcloud("storage", "ls", "-r", "gs://store-b/**").stdout

    gsutil = gsutil_of(require_gcloud())
    gcloud("cp", str(data / "a.txt"), "gs://store-b/by-gsutil.txt", tool=gsutil)
    assert gcloud("cat", "gs://store-b/by-gsutil.txt", tool=gsutil).stdout == "alpha\n"
    assert "gs://store-b/by-gsutil.txt" in gcloud("ls", "gs://store-b", tool=gsutil).stdout


def test_a_server_with_tokens_gets_the_token_gcloud_config_named(home, tmp_path, monkeypatch):
    monkeypatch.setenv("AIPTRAIN_GCS", "local")
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(json.dumps([{"name": "alice", "token": "a" * 24, "projects": ["team-a"]}]))
    (tmp_path / "alice.token").write_text("a" * 24 + "\n")
    (tmp_path / "wrong.token").write_text("w" * 24 + "\n")
    with serving(load_tokens(tokens)) as url:
        alice = configured_gcloud(url, tmp_path / "alice", "--token-file", str(tmp_path / "alice.token"),
                                  project="team-a")
        assert "Listed 0 items." in alice("ai-platform", "jobs", "list").stderr
        alice("storage", "buckets", "create", "gs://team-a-b")
        other = alice("ai-platform", "jobs", "list", "--project", "team-b", check=False)
        assert other.returncode == 1, other.stderr  # gcloud words a 403 its own way, then gives the server's message
        assert "does not have permission to access projects instance [team-b]" in other.stderr
        assert "Permission denied on project [team-b]: the caller's token does not name it." in other.stderr
        stranger = configured_gcloud(url, tmp_path / "stranger", "--token-file", str(tmp_path / "wrong.token"),
                                     project="team-a")
        refused = stranger("ai-platform", "jobs", "list", check=False)
        assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr, refused.stderr

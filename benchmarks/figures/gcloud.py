"""Figure 13: Google's real gcloud, pointed at `aiptrain serve` by `aiptrain gcloud-config`,
submits a BASIC job and streams it to SUCCEEDED, beside aiptrain's own CLI and its gcloud shim
doing the same from the same command line (gs:// staging kept on this machine for all three)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from harness import Bench, BenchError, Row, interleaved, timed

BUCKET = "gs://bench-gcloud"


def bench_real_gcloud(b: Bench) -> list[Row]:
    real = Row("13a", "BASIC submit -> SUCCEEDED through the real gcloud", "gcloud (aiptrain gcloud-config)",
               "aiptrain jobs submit training", "")
    shim = Row("13b", "BASIC submit -> SUCCEEDED through the gcloud shim", "gcloud shim (aiptrain gcloud-shim)",
               "(the same baseline samples as 13a)", "")
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        real.skipped = shim.skipped = "Google's gcloud is not on PATH"
        return [real, shim]
    home = b.new_home()
    environment = {**os.environ, "AIPTRAIN_HOME": str(home), "AIPTRAIN_DEFAULT_RUNTIME": "minimal",
                   "AIPTRAIN_GCS": "local"}
    environment.pop("AIPTRAIN_STAGING_BUCKET", None)
    server = subprocess.Popen([*b.aiptrain_cmd, "serve", "--port", "0"], env=environment, stderr=subprocess.PIPE,
                              text=True)
    try:
        url = _served_url(server)
        gcloud_env = {key: value for key, value in environment.items() if not key.startswith("CLOUDSDK_")}
        gcloud_env.update(CLOUDSDK_CONFIG=str(b.tmp / "gcloud-config"), CLOUDSDK_CORE_DISABLE_PROMPTS="1",
                          CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="true",
                          CLOUDSDK_CORE_DISABLE_USAGE_REPORTING="true")
        timed([*b.aiptrain_cmd, "gcloud-config", "--url", url], env=gcloud_env)
        Path(gcloud_env["CLOUDSDK_CONFIG"], "gce").write_text("False")
        timed([gcloud, "storage", "buckets", "create", BUCKET], env=gcloud_env)
        shim_dir = b.tmp / "shim"
        timed([*b.aiptrain_cmd, "gcloud-shim", "install", str(shim_dir)], env=environment)

        def line(job_id: str) -> list[str]:
            return ["ai-platform", "jobs", "submit", "training", job_id, "--package-path", str(b.package),
                    "--module-name", "benchtrainer.task", "--staging-bucket", BUCKET, "--region", "us-central1",
                    "--runtime-version", "minimal", "--stream-logs"]

        def run(command: list[str], env: dict, job_id: str) -> float:
            b.jobs.append((job_id, home))
            seconds, result = timed(command + line(job_id), env=env, check=False)
            if result.returncode != 0 or b"SUCCEEDED" not in result.stdout + result.stderr:
                raise BenchError(f"{command[0]}: the job did not succeed: {(result.stdout + result.stderr)[-300:]!r}")
            b.ended.add(job_id)
            return seconds

        def ours(i: int) -> None:
            real.ours.append(run([gcloud], gcloud_env, b.job_id("gcloud")))
            shim.ours.append(run([str(shim_dir / "gcloud")], environment, b.job_id("shim")))

        def base(i: int) -> None:
            seconds = run(b.aiptrain_cmd, environment, b.job_id("cli"))
            real.base.append(seconds)
            shim.base.append(seconds)

        interleaved(b.args.repeat, ours, base)
    finally:
        server.terminate()
        server.wait(timeout=30)
    real.notes.append(
        "13a: gcloud builds the sdist and uploads it to the server itself, then polls describe and "
        "Cloud Logging every ml_engine/polling_interval (1 s as gcloud-config writes it; gcloud's default "
        "is 60 s); aiptrain's CLI follows the job's log as it is written."
    )
    return [real, shim]


def _served_url(server: subprocess.Popen) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = server.stderr.readline() if server.stderr else ""
        found = re.search(r"on (http://[^ ]+) ", text)
        if found:
            return found.group(1)
        if server.poll() is not None:
            break
    raise BenchError("aiptrain serve did not say where it serves")

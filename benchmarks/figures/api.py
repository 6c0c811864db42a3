"""The REST API under load: ml v1 jobs.get and jobs.list, and aiplatform v1 customJobs.get and
customJobs.list (a page of 20), against `aiptrain serve` at steady rates (12), driven by Locust
(benchmarks/api_load.py, the `bench` extra); without it the figure says "skipped". Issue 37's
targets: get p99 <= 20 ms and list p99 <= 50 ms at 200 req/s, every request answered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from figures.store import DESCRIBED, fill_store
from harness import BENCH_EXTRA_MISSING, BENCHMARKS_DIR, Bench, BenchError, Row, progress

API_LOAD = BENCHMARKS_DIR / "api_load.py"  # benchmark 12's Locust driver, its own process
API_JOBS = 200  # jobs in the store the API answers from
API_RATES = (50, 200)  # requests per second
API_SECONDS = 10.0  # measured per (method, rate), after a 1 s warm-up


def locust_installed() -> bool:
    return subprocess.run([sys.executable, "-c", "import locust"], capture_output=True).returncode == 0


def bench_api(b: Bench) -> list[Row]:
    """jobs.get and jobs.list at steady rates against `aiptrain serve` on loopback (Locust),
    beside `aiptrain jobs describe` of the same job as a process."""
    from aiptrain.jobpaths import JobPaths
    from aiptrain.ownership import JobLock

    describe_label = "aiptrain jobs describe JOB (a process)"
    calls = [(api, rate, method) for api in ("ml", "vertex") for rate in API_RATES for method in ("get", "list")]
    rows = [Row(f"12{'abcdefgh'[i]}", f"{_NOUN[api]}.{method} at {rate} req/s: p50 latency",
                f"{_NOUN[api]}.{method}, {rate} req/s", describe_label, unit="s", target=_TARGET[(method, rate)])
            for i, (api, rate, method) in enumerate(calls)]
    if not locust_installed():
        for row in rows:
            row.skipped = BENCH_EXTRA_MISSING.format("locust")
        return rows
    home = b.new_home()
    progress(f"recording {API_JOBS} jobs through the store's API")
    running = fill_store(home, API_JOBS)
    custom_job = _record_custom_jobs(home)
    locks = [JobLock.try_acquire(JobPaths(home, job_id).lock) for job_id in running]  # driven: no reconcile
    env = {**os.environ, "AIPTRAIN_HOME": str(home)}
    env.pop("AIPTRAIN_API", None)
    log = b.tmp / "serve.log"
    with log.open("w") as output:
        server = subprocess.Popen([*b.aiptrain_cmd, "serve", "--port", "0"], env=env, stdout=subprocess.DEVNULL,
                                  stderr=output)
    try:
        url = _served_url(log, server)
        for row, (api, rate, method) in zip(rows, calls, strict=True):
            progress(f"{_NOUN[api]}.{method} at {rate} for {API_SECONDS:.0f} s")
            job = DESCRIBED if api == "ml" else custom_job
            result = subprocess.run([sys.executable, str(API_LOAD), "--url", url, "--api", api, "--method", method,
                                     "--rate", str(rate), "--seconds", str(API_SECONDS), "--job", job],
                                    capture_output=True, text=True, timeout=API_SECONDS + 120)
            if result.returncode != 0:
                raise BenchError(f"api_load.py exited {result.returncode}: {result.stderr.strip()[-800:]}")
            load = json.loads(result.stdout.strip().splitlines()[-1])
            row.ours = [load["p50_ms"] / 1000]
            row.notes.append(f"p50 {load['p50_ms']} ms, p99 {load['p99_ms']} ms, max {load['max_ms']} ms; "
                             f"{load['requests']} requests in {load['seconds']:.0f} s = {load['achieved_rps']} req/s "
                             f"achieved of {load['target_rps']:.0f} ({load['users']} clients), "
                             f"{load['failures']} failures")
        describe = [b.aiptrain(home, "jobs", "describe", DESCRIBED)[0] for _ in range(b.args.repeat)]
        for row in rows:
            row.base = describe
    finally:
        server.terminate()
        server.wait(timeout=30)
        for lock in locks:
            lock.release()
    return rows


_NOUN = {"ml": "jobs", "vertex": "customJobs"}
_TARGET = {("get", 200): "p99<=20 ms", ("list", 200): "p99<=50 ms", ("get", 50): "", ("list", 50): ""}


def _record_custom_jobs(home: Path) -> str:
    """Every job of the store recorded as a Vertex custom job as well (aiptrain.vertex.records):
    customJobs.get and .list read a record and its job. The numeric ID of the one `get` asks for."""
    from aiptrain.store import JobStore
    from aiptrain.vertex.records import CUSTOM_JOBS, VertexRecords

    with JobStore(home / "jobs.db") as store:
        records = VertexRecords(store)
        found = ""
        for job in store.all():
            body = {"displayName": job.job_id, "jobSpec": {"workerPoolSpecs": [{
                "replicaCount": "1", "machineSpec": {"machineType": "n1-standard-4"},
                "containerSpec": {"imageUri": "aiptrain/runtime:2.11"}}]}}
            record = records.add("aiptrain", CUSTOM_JOBS, "us-central1", body, job_key=job.job_id)
            found = record.id if job.job_id == DESCRIBED else found
    return found


def _served_url(log: Path, server: subprocess.Popen) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        first = log.read_text().partition("\n")[0]
        if " on http://" in first:
            return first.split(" on ", 1)[1].split()[0]
        if server.poll() is not None:
            raise BenchError(f"aiptrain serve exited {server.returncode}: {log.read_text()[-800:]}")
        time.sleep(0.1)
    raise BenchError("aiptrain serve did not say where it listens within 60 s")

"""The REST API under load: jobs.get and jobs.list against `aiptrain serve` at steady rates (12),
driven by Locust (benchmarks/api_load.py, the `bench` extra); without it the figure says "skipped"."""

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
    from aiptrain.ownership import JobLock

    describe_label = "aiptrain jobs describe JOB (a process)"
    rows = [Row(f"12{'abcd'[i]}", f"jobs.{method} at {rate} req/s: p50 latency", f"jobs.{method}, {rate} req/s",
                describe_label, unit="s")
            for i, (rate, method) in enumerate((rate, method) for rate in API_RATES for method in ("get", "list"))]
    if not locust_installed():
        for row in rows:
            row.skipped = BENCH_EXTRA_MISSING.format("locust")
        return rows
    home = b.new_home()
    progress(f"recording {API_JOBS} jobs through the store's API")
    running = fill_store(home, API_JOBS)
    locks = [JobLock.try_acquire(home / "locks" / f"{job_id}.lock") for job_id in running]  # driven: no reconcile
    env = {**os.environ, "AIPTRAIN_HOME": str(home)}
    env.pop("AIPTRAIN_API", None)
    log = b.tmp / "serve.log"
    with log.open("w") as output:
        server = subprocess.Popen([*b.aiptrain_cmd, "serve", "--port", "0"], env=env, stdout=subprocess.DEVNULL,
                                  stderr=output)
    try:
        url = _served_url(log, server)
        for row in rows:
            method, rate = row.ours_label.removeprefix("jobs.").split(", ")
            progress(f"jobs.{method} at {rate} for {API_SECONDS:.0f} s")
            result = subprocess.run([sys.executable, str(API_LOAD), "--url", url, "--method", method,
                                     "--rate", rate.split()[0], "--seconds", str(API_SECONDS), "--job", DESCRIBED],
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

"""The controller: its memory with 1, 10 and 100 running jobs (10), and 500 jobs through
admission with its memory at the end (11)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness import (
    BENCH_LABEL,
    BENCHMARKS_DIR,
    IMAGE,
    SLEEP_SECONDS,
    Bench,
    BenchError,
    Row,
    docker,
    first_user_lines,
    no_admission_cap,
)

MEMORY_JOB_COUNTS = (1, 10, 100)  # running jobs at which figure 10 weighs the controller
MANY_JOBS = 500  # figure 11: BASIC jobs submitted at once
MANY_JOBS_PARALLEL = 8  # replicas running at once in figure 11, for aiptrain (its cap) and by hand
MANY_JOBS_LOAD = BENCHMARKS_DIR / "many_jobs.py"  # figure 11's submits, through the Python API, its own process


def controller_memory_mb(home: Path) -> tuple[float, float]:
    """(VmRSS, private memory) of the home's controller. RSS counts the shared libraries
    (libpython, libcrypto, pydantic-core), whose pages every aiptrain process shares; the private
    part is what the controller itself holds."""
    pid = json.loads((home / "controller.json").read_text())["pid"]
    proc = Path("/proc") / str(pid)
    rss = int((proc / "status").read_text().split("VmRSS:")[1].split()[0])
    rollup = dict(line.split(":", 1) for line in (proc / "smaps_rollup").read_text().splitlines()[1:])
    private = sum(int(rollup[key].split()[0]) for key in ("Private_Clean", "Private_Dirty"))
    return rss / 1024, private / 1024


def bench_memory(b: Bench) -> list[Row]:
    """The controller's memory with 1, 10 and 100 BASIC jobs running (each replica printing, its log
    follower attached), and what each further running job adds."""
    rss = {n: Row(f"10{'abc'[i]}", f"controller's memory (RSS) with {n} running job{'s' * (n > 1)}",
                  "VmRSS of the home's controller", "TorchX local_docker: no process per job", unit="MB")
           for i, n in enumerate(MEMORY_JOB_COUNTS)}
    marginal = Row("10d", "private memory each further running job costs the controller",
                   f"(private at {MEMORY_JOB_COUNTS[-1]} - private at 1) / {MEMORY_JOB_COUNTS[-1] - 1}",
                   "TorchX: none", "<=2 MB", unit="MB")
    home, running, private = b.new_home(), [], {}

    def start(job_id: str) -> None:
        b.submit(home, job_id, trainer_args=("--sleep", SLEEP_SECONDS))
        first_user_lines(home / "logs" / f"{job_id}.jsonl", 1, time.monotonic() + 600)

    try:
        with no_admission_cap(), ThreadPoolExecutor(max_workers=4) as pool:
            for n in MEMORY_JOB_COUNTS:
                more = [b.job_id(f"mem{len(running) + i}") for i in range(n - len(running))]
                running += more
                list(pool.map(start, more))
                time.sleep(2)  # every follower attached, the controller in its steady state
                megabytes_rss, private[n] = controller_memory_mb(home)
                rss[n].ours.append(megabytes_rss)
                rss[n].base.append(0.0)
    finally:
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda job_id: b.cancel(home, job_id), running))
    first, last = MEMORY_JOB_COUNTS[0], MEMORY_JOB_COUNTS[-1]
    if first in private and last in private:
        marginal.ours.append((private[last] - private[first]) / (last - first))
        marginal.base.append(0.0)
    rss[first].notes.append(
        "10: one controller drives every job of a home; measured once per count, the jobs kept running from one "
        "count to the next. TorchX's docker scheduler keeps nothing running per job (0 MB). Before the "
        "controller, each running job had its own supervisor process: 43 MB RSS, 28 MB of it private.")
    return [*rss.values(), marginal]


def bench_many_jobs(b: Bench) -> list[Row]:
    """MANY_JOBS BASIC jobs submitted at once (a trainer that exits at once) through the Python API,
    at most MANY_JOBS_PARALLEL running: jobs per minute, against the same containers run by hand
    MANY_JOBS_PARALLEL at a time. Every job must succeed."""
    row = Row("11a", f"{MANY_JOBS} BASIC jobs submitted at once, through admission",
              f"submit all (Python API, 8 threads), then wait for all; at most {MANY_JOBS_PARALLEL} running",
              f"docker run --rm of the same image, {MANY_JOBS_PARALLEL} at a time", unit="jobs/min")
    memory = Row("11b", f"controller's memory (RSS) at the end of {MANY_JOBS} jobs", "VmRSS of the controller",
                 "TorchX: no process", unit="MB")
    home = b.new_home()
    env = {"AIPTRAIN_HOME": str(home), "AIPTRAIN_DEFAULT_RUNTIME": "minimal",
           "AIPTRAIN_MAX_RUNNING_REPLICAS": str(MANY_JOBS_PARALLEL)}
    result = subprocess.run([sys.executable, str(MANY_JOBS_LOAD), "--package", str(b.package.parent),
                             "--count", str(MANY_JOBS), "--prefix", b.job_id("many"),
                             "--job-dirs", str(b.tmp / "job-dirs")],
                            env={**os.environ, **env}, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise BenchError(f"the {MANY_JOBS}-job run failed: {result.stderr.strip()[-500:]}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if report["lost"] or report["not_succeeded"]:
        raise BenchError(f"{MANY_JOBS} jobs: {report}")
    row.ours.append(MANY_JOBS / report["seconds"] * 60)
    memory.ours.append(controller_memory_mb(home)[0])
    memory.base.append(0.0)

    def by_hand(_: int) -> None:
        docker("run", "--rm", "--label", f"{BENCH_LABEL}={b.run_id}", "--user", b.user, IMAGE, "python3", "-c",
               "print('hello from the benchmark trainer')")

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=MANY_JOBS_PARALLEL) as pool:
        list(pool.map(by_hand, range(MANY_JOBS)))
    row.base.append(MANY_JOBS / (time.monotonic() - started) * 60)
    row.notes.append(f"11: a higher ratio is better here (jobs per minute). All {MANY_JOBS} jobs SUCCEEDED, "
                     "none lost (the queue's order is tested in test_admission*); each aiptrain job is recorded, staged (the sdist "
                     "built once and reused), planned, admitted, launched on its own network, its log copied, "
                     "torn down and recorded.")
    return [row, memory]

#!/usr/bin/env python3
"""aiptrain's benchmarks: each aiptrain operation timed side by side with a raw Docker
(or raw Python) baseline in the same run, N times, interleaved, so that both sides see
the same machine load.

    .venv-bench/bin/python benchmarks/run.py [--repeat N] [--only 1,3] [--lines 20000]

Prints a table of medians (and minimums) with the ratio aiptrain / baseline, and
writes every sample to benchmarks/results/latest.json. Timings are never asserted:
this is a measuring tool, not a test. See benchmarks/README.md for what each number
means; harness.py holds what every figure shares, figures/ one module per group.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from figures import api, controller, gcloud, logs, peers, start, store, tuning, vertex
from harness import IMAGE, RESULTS_DIR, Bench, BenchError, Row, machine, print_report, progress, write_results

BENCHMARKS = {
    "1": ("CLI start-up", start.bench_startup),
    "2": ("BASIC submit -> SUCCEEDED", start.bench_basic),
    "3": ("STANDARD_1 submit -> RUNNING", start.bench_standard_1),
    "4": ("resubmit vs first submit", start.bench_resubmit),
    "5": ("log streaming", logs.bench_logs),
    "5c": (f"log throughput, {logs.LOG_REPLICAS} replicas", logs.bench_log_throughput),
    "5d": ("follow latency", logs.bench_follow_latency),
    "5e": (f"log copying, {logs.COPY_JOBS} jobs at once", logs.bench_copy_many),
    "6": ("hyperparameter study", tuning.bench_study),
    "7": ("submit -> every replica in user code", start.bench_first_line),
    "8": ("jobs list and describe over 10,000 stored jobs", store.bench_list),
    "9": ("BASIC and STANDARD_1 vs TorchX", peers.bench_torchx),
    "10": ("controller memory with 1, 10 and 100 running jobs", controller.bench_memory),
    "11": (f"{controller.MANY_JOBS} jobs through admission", controller.bench_many_jobs),
    "12": ("the REST API under load: get and list of ml v1 jobs and Vertex customJobs at 50 and 200 req/s",
           api.bench_api),
    "13": ("BASIC submit -> SUCCEEDED through the real gcloud and the shim", gcloud.bench_real_gcloud),
    "14": ("a Vertex AI custom job vs the AI Platform job of the same trainer", vertex.bench_vertex),
}
WITHOUT_ENGINE = {"1", "8", "12"}  # benchmarks that run no container


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each side of each benchmark (default 5)")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated benchmark numbers, e.g. 1,3")
    parser.add_argument("--lines", type=int,
                        help=f"log lines of benchmark 5: of its job (5a, 5b; default {logs.DEFAULT_LINES}) and of "
                             f"each of 5c's {logs.LOG_REPLICAS} replicas (default {logs.DEFAULT_REPLICA_LINES})")
    parser.add_argument("--log-job-runs", type=int, default=1,
                        help="benchmark 5a: runs of the 20k-line job per side (default 1; it is slow)")
    parser.add_argument("--resubmit-job-dir", choices=("same", "new"), default="same",
                        help="benchmark 4: resubmit with the same --job-dir as the first submit, or a new one")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "latest.json", help="where the JSON goes")
    args = parser.parse_args(argv)
    selected = [key.strip() for key in args.only.split(",") if key.strip()]
    unknown = [key for key in selected if key not in BENCHMARKS]
    if unknown or args.repeat < 1 or args.log_job_runs < 1:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}" if unknown
                     else "--repeat and --log-job-runs must be at least 1")

    needs_engine = not set(selected) <= WITHOUT_ENGINE
    if needs_engine and subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        print(f"{IMAGE} is not on the Docker engine: run `make images` first.", file=sys.stderr)
        return 3

    info = machine()
    print(f"aiptrain benchmarks: repeat={args.repeat}, {info['cpus']} CPUs, load {info['loadavg_start']}",
          file=sys.stderr)
    bench = Bench(args)
    rows: list[Row] = []
    started = time.perf_counter()
    leftovers: list[str] = []
    try:
        for key in selected:
            name, function = BENCHMARKS[key]
            print(f"[{key}] {name} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                rows += function(bench)
            except (BenchError, subprocess.TimeoutExpired) as exc:
                rows.append(Row(key, name, "", "", error=str(exc)))
                progress(f"ERROR: {exc}")
            progress(f"done in {time.perf_counter() - t0:.0f}s")
    finally:
        leftovers = bench.cleanup()
    info["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    info["total_s"] = round(time.perf_counter() - started, 1)
    info["repeat"] = args.repeat
    info["lines"] = args.lines

    print_report(rows, info, leftovers)
    write_results(args.output, rows, info, leftovers)
    return 1 if any(row.error for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

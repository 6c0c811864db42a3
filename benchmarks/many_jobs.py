#!/usr/bin/env python3
"""Figure 11's load: COUNT BASIC jobs of the benchmark trainer submitted at once from 8 threads
through aiptrain's Python API, as a pipeline would use it, then waited for; its own process, in
the AIPTRAIN_HOME (and AIPTRAIN_MAX_RUNNING_REPLICAS) of its environment. Prints one JSON line:
the seconds from the first submit to the last job's end, how many jobs were lost and which did
not succeed.

    python benchmarks/many_jobs.py --package DIR --count 500 --prefix PREFIX --job-dirs DIR
"""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

import aiptrain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", required=True, help="the directory that holds the benchtrainer package")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--prefix", required=True, help="of the job IDs: PREFIX_0000, PREFIX_0001, ...")
    parser.add_argument("--job-dirs", required=True, help="each job's --job-dir is DIR/JOB_ID")
    args = parser.parse_args()

    ids = [f"{args.prefix}_{n:04d}" for n in range(args.count)]
    started = time.monotonic()

    def submit(job_id):
        with aiptrain.Client() as client:
            client.submit_training(job_id, f"{args.package}/benchtrainer", "benchtrainer.task",
                                   f"{args.job_dirs}/{job_id}", region="us-central1", runtime_version="minimal")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(submit, ids))
    with aiptrain.Client() as client:
        jobs = [client.wait(job_id, timeout=3600) for job_id in ids]
    seconds = time.monotonic() - started
    print(json.dumps({"seconds": seconds, "lost": args.count - len(jobs),
                      "not_succeeded": [j.job_id for j in jobs if j.state.value != "SUCCEEDED"]}))


if __name__ == "__main__":
    main()

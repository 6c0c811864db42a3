#!/usr/bin/env python3
"""Benchmark 12's load: Locust (as a library, its own process: it monkey-patches the standard
library with gevent) sends ml v1 `jobs.get` or `jobs.list` (or aiplatform v1 `customJobs.get` /
`customJobs.list` with `--api vertex`) to an `aiptrain serve` at a steady rate for a bounded time,
and prints one JSON line: requests, failures, the rate achieved, and the p50/p99 latency in
milliseconds.

    python benchmarks/api_load.py --url http://127.0.0.1:PORT --method get --rate 50 --seconds 10 --job JOB

The rate comes from USERS users each holding a kept-alive connection and sending a request
every USERS/rate seconds on its own schedule (as Locust's `constant_throughput`), as many
clients polling a server do, each starting at its own point of the period. `--in-phase` starts
them all at the same instant instead, as Locust does with every user of one spawn step (a step
is `floor(spawn_rate)` users): then 40 users send their 40 requests at once every 200 ms rather
than one every 5 ms. A server slower than the rate shows as an achieved rate below it (Locust's
users wait for their answer), and as the latency it could give. The first
second is a warm-up and not counted.
"""

from __future__ import annotations

import argparse
import json
import time

import gevent
from locust import FastHttpUser, task
from locust.env import Environment

USER_RATE = 5.0  # requests per second of one simulated client
WARM_UP_SECONDS = 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--method", choices=("get", "list"), required=True)
    parser.add_argument("--rate", type=float, required=True, help="requests per second, all users together")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the load is measured")
    parser.add_argument("--job", default="", help="jobs.get: the job to get")
    parser.add_argument("--project", default="aiptrain")
    parser.add_argument("--api", choices=("ml", "vertex"), default="ml",
                        help="ml v1 jobs, or aiplatform v1 customJobs (--job: the numeric ID)")
    parser.add_argument("--in-phase", action="store_true",
                        help="start every user at the same instant: bursts of USERS requests each period")
    args = parser.parse_args()

    jobs = f"/v1/projects/{args.project}/jobs"
    if args.api == "vertex":
        jobs = f"/v1/projects/{args.project}/locations/us-central1/customJobs"
    path = f"{jobs}/{args.job}" if args.method == "get" else f"{jobs}?pageSize=20"
    users = max(1, round(args.rate / USER_RATE))

    period = users / args.rate  # each user's time between requests
    started = iter(range(users))

    class Client(FastHttpUser):
        host = args.url

        def on_start(self) -> None:
            if not args.in_phase:  # the n-th user begins n/USERS of a period in
                gevent.sleep(next(started) * period / users)
            self.due = time.monotonic()

        def wait_time(self) -> float:
            """A request every `period` on the user's own schedule (constant_throughput, kept
            on the schedule the user started on)."""
            self.due += period
            return max(0.0, self.due - time.monotonic())

        @task
        def call(self) -> None:
            self.client.get(path, name=args.method)

    env = Environment(user_classes=[Client])
    runner = env.create_local_runner()
    runner.start(users, spawn_rate=users)
    gevent.sleep(WARM_UP_SECONDS + period)  # every user started, then the warm-up
    env.stats.reset_all()
    gevent.sleep(args.seconds)
    total = env.stats.total
    result = {
        "api": args.api, "method": args.method, "target_rps": args.rate, "users": users, "in_phase": args.in_phase, "seconds": args.seconds,
        "requests": total.num_requests, "failures": total.num_failures,
        "achieved_rps": round(total.num_requests / args.seconds, 1),
        "p50_ms": total.get_response_time_percentile(0.5), "p99_ms": total.get_response_time_percentile(0.99),
        "max_ms": round(total.max_response_time, 1),
    }
    runner.quit()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

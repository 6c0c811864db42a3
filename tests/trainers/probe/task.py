"""A test trainer whose behaviour per replica is set by flags.

  --run TYPE=SECONDS    how long replicas of TYPE (chief/master, worker, ps, evaluator) run;
                        `ps` runs forever by default, like a real parameter server
  --exit TYPE:INDEX=N   exit with status N when done
  --lines N             print N numbered lines first
"""

import argparse
import json
import os
import sys
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", action="append", default=[])
    parser.add_argument("--exit", action="append", default=[])
    parser.add_argument("--lines", type=int, default=0)
    parser.add_argument("--job-dir")
    args = parser.parse_args()

    task = json.loads(os.environ["TF_CONFIG"])["task"]
    kind, index = task["type"], task["index"]
    run = {"chief": 0.5, "master": 0.5, "worker": 0.5, "evaluator": 0.5, "ps": float("inf")}
    for item in args.run:
        name, _, seconds = item.partition("=")
        run[name] = float(seconds)
    codes = dict(item.split("=") for item in args.exit)

    print(f"probe {kind} {index} started", flush=True)
    print(f"probe {kind} {index} says hello on stderr", file=sys.stderr, flush=True)
    for number in range(args.lines):
        print(f"line {number}")
    sys.stdout.flush()
    deadline = time.monotonic() + run[kind]
    while time.monotonic() < deadline:
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    if args.job_dir and kind in ("chief", "master"):
        with open(os.path.join(args.job_dir, "done.txt"), "w") as handle:
            handle.write("ok")
    code = int(codes.get(f"{kind}:{index}", 0))
    print(f"probe {kind} {index} exiting with {code}", flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()

"""A test trainer whose behaviour per replica is set by flags.

  --run TYPE=SECONDS    how long replicas of TYPE (chief/master, worker, ps, evaluator) run;
                        `ps` runs forever by default, like a real parameter server
  --exit TYPE:INDEX=N   exit with status N when done
  --lines N             print N numbered lines first
  --until TYPE          replicas of TYPE run until the job dir holds `finish` (the test says when)
  --hold TYPE           replicas of TYPE answer SIGTERM by waiting until the job dir holds
                        `release`, then print --bye numbered lines and exit 0: a teardown that
                        lasts until the test lets it go
  --bye N               lines printed by a held replica on its way out
"""

import argparse
import json
import os
import signal
import sys
import time

terminated = False


def on_sigterm(signum, frame):
    global terminated
    terminated = True


def canonical(kind):
    """`master` names the chief (TF_CONFIG calls it `chief` in runtime 2.x)."""
    return "chief" if kind == "master" else kind


def wait_for_file(job_dir, name):
    while not os.path.exists(os.path.join(job_dir, name)):
        time.sleep(0.05)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", action="append", default=[])
    parser.add_argument("--exit", action="append", default=[])
    parser.add_argument("--lines", type=int, default=0)
    parser.add_argument("--until", action="append", default=[])
    parser.add_argument("--hold", action="append", default=[])
    parser.add_argument("--bye", type=int, default=0)
    parser.add_argument("--job-dir")
    args = parser.parse_args()

    task = json.loads(os.environ["TF_CONFIG"])["task"]
    kind, index = task["type"], task["index"]
    hold, until = {canonical(k) for k in args.hold}, {canonical(k) for k in args.until}
    if canonical(kind) in hold:  # before saying "started": the test stops the job once it has read that
        signal.signal(signal.SIGTERM, on_sigterm)
    run = {"chief": 0.5, "worker": 0.5, "evaluator": 0.5, "ps": float("inf")}
    for item in args.run:
        name, _, seconds = item.partition("=")
        run[canonical(name)] = float(seconds)
    codes = {canonical(key.partition(":")[0]) + ":" + key.partition(":")[2]: code
             for key, code in (item.split("=") for item in args.exit)}

    print(f"probe {kind} {index} started", flush=True)
    print(f"probe {kind} {index} says hello on stderr", file=sys.stderr, flush=True)
    for number in range(args.lines):
        print(f"line {number}")
    sys.stdout.flush()
    deadline = time.monotonic() + run[canonical(kind)]
    while time.monotonic() < deadline:
        if terminated:
            print(f"probe {kind} {index} got SIGTERM, held", flush=True)
            wait_for_file(args.job_dir, "release")
            for number in range(args.bye):
                print(f"bye {number}")
            sys.stdout.flush()
            sys.exit(0)
        if canonical(kind) in until and os.path.exists(os.path.join(args.job_dir, "finish")):
            break
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    if args.job_dir and kind in ("chief", "master"):
        with open(os.path.join(args.job_dir, "done.txt"), "w") as handle:
            handle.write("ok")
    code = int(codes.get(f"{canonical(kind)}:{index}", 0))
    print(f"probe {kind} {index} exiting with {code}", flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()

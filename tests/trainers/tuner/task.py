"""A test trainer for tuning jobs. Its objective is `x + n` (the trial's --x and --n), reported
--reports times (ramping up to the objective) in cloudml-hypertune's file format, written
here directly so the tests need no package from an index.

  --fail-on C      exit 1 when the trial's --c is C
  --sleep S        seconds between reports
  --tag T          the metric tag to report under (default training/hptuning/metric)
"""

import argparse
import json
import os
import sys
import time


def report(path, tag, value, step, history):
    history.append({tag: str(value), "global_step": str(step), "timestamp": time.time(),
                    "trial": os.environ.get("CLOUD_ML_TRIAL_ID", "0")})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:  # cloudml-hypertune rewrites the whole file each time
        handle.write("\n".join(json.dumps(entry, sort_keys=True) for entry in history[-100:]) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--x", type=float, default=0.0)
    parser.add_argument("--n", type=int, default=0)
    parser.add_argument("--c", default="")
    parser.add_argument("--fail-on", default=None)
    parser.add_argument("--reports", type=int, default=1)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--tag", default="training/hptuning/metric")
    parser.add_argument("--job-dir")
    args = parser.parse_args()

    task = json.loads(os.environ["TF_CONFIG"])["task"]
    print(f"tuner trial {task.get('trial')} {task['type']} x={args.x} n={args.n} c={args.c}", flush=True)
    if args.fail_on is not None and args.c == args.fail_on:
        print(f"failing because c={args.c}", file=sys.stderr, flush=True)
        sys.exit(1)
    objective = args.x + args.n
    history = []
    path = os.environ.get("CLOUD_ML_HP_METRIC_FILE", "/tmp/hypertune/output.metrics")
    for step in range(1, args.reports + 1):
        report(path, args.tag, objective * step / args.reports, step, history)
        time.sleep(args.sleep)
    if args.job_dir:
        os.makedirs(args.job_dir, exist_ok=True)
        with open(os.path.join(args.job_dir, "objective.txt"), "w") as handle:
            handle.write(str(objective))


if __name__ == "__main__":
    main()

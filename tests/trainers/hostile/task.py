"""A hostile tuning trainer (issue 21): it runs as the replica user with the job dir mounted
read-write and plants, where the host side (root) will look, what a trainer must never make it
follow or block on. --attack picks what; every trial also reports a plain metric unless its
attack replaces the metric file.

  link-next-trial  <job-dir>/../<trial+1> and <trial+2> become links to --secret (a host dir)
  link-metric      the metric file is a link to --secret/secret (a root-only file)
  zero-metric      the metric file is a link to /dev/zero
  fifo-metric      the metric file is a FIFO
  hostile-events   event files that are a FIFO and links, and a directory link to /
  plain            nothing hostile
"""

import argparse
import json
import os
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--attack", default="plain")
    parser.add_argument("--secret", default="/nonexistent")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--job-dir", required=True)
    args, _ = parser.parse_known_args()  # other trial values (--n) only tell trials apart

    trial = int(os.environ.get("CLOUD_ML_TRIAL_ID", "0"))
    metric = os.environ["CLOUD_ML_HP_METRIC_FILE"]
    os.makedirs(args.job_dir, exist_ok=True)
    with open(os.path.join(os.path.dirname(args.job_dir), "runs.log"), "a") as runs:
        runs.write(f"{trial}\n")
    os.makedirs(os.path.dirname(metric), exist_ok=True)
    if args.attack == "link-next-trial":
        for later in (trial + 1, trial + 2):
            target = os.path.join(os.path.dirname(args.job_dir), str(later))
            if not os.path.lexists(target):
                os.symlink(args.secret, target)
    if args.attack == "link-metric":
        os.symlink(os.path.join(args.secret, "secret"), metric)
    elif args.attack == "zero-metric":
        os.symlink("/dev/zero", metric)
    elif args.attack == "fifo-metric":
        os.mkfifo(metric)
    else:
        with open(metric, "w") as handle:
            handle.write(json.dumps({"training/hptuning/metric": str(trial), "global_step": "1"}) + "\n")
    if args.attack == "hostile-events":
        os.mkfifo(os.path.join(args.job_dir, "events.out.tfevents.1.fifo"))
        os.symlink(os.path.join(args.secret, "secret"), os.path.join(args.job_dir, "events.out.tfevents.2.link"))
        os.symlink("/", os.path.join(args.job_dir, "root"))
    print(f"hostile trial {trial}: {args.attack}", flush=True)
    time.sleep(args.sleep)


if __name__ == "__main__":
    main()

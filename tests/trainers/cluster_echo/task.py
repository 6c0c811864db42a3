"""A test trainer for `aiptrain local train`: every process prints the environment it was given
and writes `<type>-<index>.json` (its PID, its child's PID, cwd, TF_CONFIG, PyTorch variables)
into --job-dir. Background tasks then run until they are stopped; the primary (chief or master)
runs --primary-seconds and exits with --primary-exit.

  --child            background tasks start a child process (to check that it is stopped too)
  --ignore-sigterm   background tasks ignore SIGTERM (to check that SIGKILL follows)
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

TORCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True)
    parser.add_argument("--primary-seconds", type=float, default=0.0)
    parser.add_argument("--primary-exit", type=int, default=0)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    args = parser.parse_args()

    tf_config = json.loads(os.environ["TF_CONFIG"])
    task = tf_config["task"] or {"type": "single", "index": 0}
    primary = task["type"] in ("chief", "master", "single")
    if args.ignore_sigterm and not primary:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = None
    if args.child and not primary:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    report = {
        "pid": os.getpid(),
        "child_pid": child.pid if child else None,
        "cwd": os.getcwd(),
        "tf_config": tf_config,
        "torch": {name: os.environ.get(name) for name in TORCH_VARS},
    }
    name = f"{task['type']}-{task['index']}"
    path = os.path.join(args.job_dir, f"{name}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(report, handle)
    os.rename(path + ".tmp", path)  # complete when it appears
    print(f"{name} started", flush=True)
    print(f"{name} on stderr", file=sys.stderr, flush=True)
    if not primary:
        while True:
            time.sleep(1)
    time.sleep(args.primary_seconds)
    print(f"{name} exiting with {args.primary_exit}", flush=True)
    sys.exit(args.primary_exit)


if __name__ == "__main__":
    main()

"""A framework-free trainer: fits y = 3x + 1 by gradient descent, writes a checkpoint per
epoch and a final model into --job-dir. `--fail-with N` makes it exit with status N."""

import argparse
import json
import os
import random
import sys


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--fail-with", type=int, default=0, help="exit with this status after training")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--job-dir", required=True)
    args = parser.parse_args(argv)

    tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    task = tf_config.get("task", {})
    print(f"Starting {task.get('type', 'master')} {task.get('index', 0)}: {args.steps} steps", flush=True)

    rng = random.Random(0)
    weight, bias = 0.0, 0.0
    for step in range(1, args.steps + 1):
        x = rng.uniform(-1, 1)
        error = weight * x + bias - (3 * x + 1)
        weight -= args.learning_rate * error * x
        bias -= args.learning_rate * error
        if step % max(1, args.steps // 5) == 0:
            print(f"step {step}: loss={error * error:.6f}", flush=True)
        if args.sleep:
            import time

            time.sleep(args.sleep)

    if args.fail_with:
        print(f"failing on purpose with status {args.fail_with}", file=sys.stderr, flush=True)
        sys.exit(args.fail_with)

    os.makedirs(args.job_dir, exist_ok=True)
    if task.get("type", "master") in ("master", "chief"):
        with open(os.path.join(args.job_dir, "model.json"), "w") as handle:
            json.dump({"weight": weight, "bias": bias, "steps": args.steps}, handle)
        print(f"Wrote model to {os.path.join(args.job_dir, 'model.json')}", flush=True)


if __name__ == "__main__":
    main()

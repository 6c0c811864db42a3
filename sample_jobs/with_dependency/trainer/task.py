"""Fits y = 3x + 1 like the basic sample, and reports its progress with `tabulate`, a
dependency that only the wheelhouse can provide (replicas reach no package index)."""

import argparse
import json
import os
import random

import tabulate


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--job-dir", required=True)
    args = parser.parse_args(argv)

    print(f"Imported tabulate {tabulate.__version__} from {tabulate.__file__}", flush=True)
    rng = random.Random(0)
    weight, bias, rows = 0.0, 0.0, []
    for step in range(1, args.steps + 1):
        x = rng.uniform(-1, 1)
        error = weight * x + bias - (3 * x + 1)
        weight -= args.learning_rate * error * x
        bias -= args.learning_rate * error
        if step % max(1, args.steps // 4) == 0:
            rows.append((step, f"{error * error:.6f}"))
    print(tabulate.tabulate(rows, headers=["step", "loss"]), flush=True)

    os.makedirs(args.job_dir, exist_ok=True)
    with open(os.path.join(args.job_dir, "model.json"), "w") as handle:
        json.dump({"weight": weight, "bias": bias, "tabulate": tabulate.__version__}, handle)


if __name__ == "__main__":
    main()

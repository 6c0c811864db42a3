"""A framework-free trainer for hyperparameter tuning: its score depends only on the values
a trial gets, so the best trial is known in advance. It reports the score through the real
cloudml-hypertune package, as trainers on AI Platform do, a few times per trial (the last
report is the trial's final metric), and writes its result into its trial's --job-dir.

  score = 1 - (learning_rate - 0.1)^2 * 50 - (hidden_units - 64)^2 / 4096 + bonus(optimizer)

so learning_rate 0.1, hidden_units 64 and optimizer `adam` score best.
"""

import argparse
import json
import os
import time

import hypertune

OPTIMIZER_BONUS = {"adam": 0.05, "sgd": 0.0, "rmsprop": 0.02}


def score(learning_rate: float, hidden_units: int, optimizer: str) -> float:
    return 1 - (learning_rate - 0.1) ** 2 * 50 - (hidden_units - 64) ** 2 / 4096 + OPTIMIZER_BONUS[optimizer]


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--learning_rate", type=float, default=0.01)
    parser.add_argument("--hidden_units", type=int, default=32)
    parser.add_argument("--optimizer", default="sgd", choices=sorted(OPTIMIZER_BONUS))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per epoch")
    parser.add_argument("--job-dir", required=True)
    args = parser.parse_args(argv)

    trial = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("trial", "")
    final = score(args.learning_rate, args.hidden_units, args.optimizer)
    reporter = hypertune.HyperTune()
    for epoch in range(1, args.epochs + 1):
        value = final * epoch / args.epochs  # the score "improves" over the epochs
        print(f"trial {trial} epoch {epoch}: accuracy={value:.6f}", flush=True)
        reporter.report_hyperparameter_tuning_metric(
            hyperparameter_metric_tag="accuracy", metric_value=value, global_step=epoch * 100
        )
        time.sleep(args.sleep)

    os.makedirs(args.job_dir, exist_ok=True)
    with open(os.path.join(args.job_dir, "result.json"), "w") as handle:
        json.dump({"trial": trial, "accuracy": final, **vars(args)}, handle)


if __name__ == "__main__":
    main()

"""Trains a tiny scikit-learn model and an XGBoost model on generated data and saves both
into --job-dir (model.joblib, model.bst, metrics.json); reports the XGBoost accuracy
through cloudml-hypertune, as a tuning trainer on AI Platform would."""

import argparse
import json
import os

import hypertune
import joblib
import numpy as np
import sklearn
import xgboost as xgb
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True)
    parser.add_argument("--n-estimators", type=int, default=20)
    parser.add_argument("--max-depth", type=int, default=3)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    features = rng.normal(size=(400, 4))
    labels = (features[:, 0] + 0.5 * features[:, 1] - features[:, 2] > 0).astype(int)
    x_train, x_test, y_train, y_test = train_test_split(features, labels, test_size=0.25, random_state=0)

    linear = LogisticRegression().fit(x_train, y_train)
    booster = xgb.XGBClassifier(n_estimators=args.n_estimators, max_depth=args.max_depth).fit(x_train, y_train)
    metrics = {
        "sklearn_version": sklearn.__version__,
        "xgboost_version": xgb.__version__,
        "logistic_regression_accuracy": float(linear.score(x_test, y_test)),
        "xgboost_accuracy": float(booster.score(x_test, y_test)),
    }
    print(json.dumps(metrics), flush=True)
    hypertune.HyperTune().report_hyperparameter_tuning_metric(
        hyperparameter_metric_tag="accuracy", metric_value=metrics["xgboost_accuracy"], global_step=1
    )

    os.makedirs(args.job_dir, exist_ok=True)
    joblib.dump(linear, os.path.join(args.job_dir, "model.joblib"))
    booster.save_model(os.path.join(args.job_dir, "model.bst"))
    with open(os.path.join(args.job_dir, "metrics.json"), "w") as out:
        json.dump(metrics, out)


if __name__ == "__main__":
    main()

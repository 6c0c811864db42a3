"""The built-in XGBoost algorithm: the preprocessed rows as numbers (categorical columns one-hot,
as artifacts/metadata.json records), XGBoost's parameters as given, `--num_boost_round` rounds
evaluated on the training and validation data each round, and the booster saved as
--job-dir/model/model.bst (what a model version of framework XGBOOST loads).

Metrics reported for tuning, on the validation data (else the training data): `accuracy`
(classification objectives) or `rmse`, and each of XGBoost's own evaluation metrics under its
name (`logloss`, `error`, `auc`, ...).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable

import numpy as np
import xgboost as xgb

from . import files, outputs
from .flags import FlagError, Flags
from .preprocess import Prepared, one_hot_names, one_hot_rows, targets, weights

MODEL_FILE = "model.bst"
# The algorithm's own flags; every other flag given is one of XGBoost's parameters.
NOT_PARAMETERS = {"preprocess", "training_data_path", "validation_data_path", "test_data_path", "job_dir",
                  "validation_split", "test_split", "num_boost_round", "csv_weight", "objective", "num_class"}
LOG_LINES = 20


def parameters(flags: Flags, classes: int) -> dict:
    """xgboost.train's params: the objective, num_class for a multi: one, and the XGBoost
    parameters the job gave (XGBoost's defaults for the rest)."""
    objective = "reg:squarederror" if flags.objective == "reg:linear" else flags.objective
    params = {"objective": objective, **{name: flags.values[name] for name in sorted(flags.given - NOT_PARAMETERS)}}
    if objective.startswith("binary:") and classes != 2:
        raise FlagError(f"--objective={flags.objective} needs two classes; the target column has {classes}: use a "
                        "multi: objective.")
    if objective.startswith("multi:"):
        if flags.num_class is not None and flags.num_class < classes:
            raise FlagError(f"--num_class={flags.num_class} is fewer than the target column's {classes} classes.")
        params["num_class"] = flags.num_class or classes
    return params


def matrix(prepared: Prepared, rows: list[list[str]]):
    schema = prepared.schema
    return xgb.DMatrix(np.asarray(one_hot_rows(schema, rows), dtype=np.float32).reshape(len(rows), -1),
                       label=np.asarray(targets(schema, rows), dtype=np.float32), weight=_weights(prepared, rows))


def _weights(prepared: Prepared, rows: list[list[str]]):
    found = weights(prepared.schema, rows)
    return np.asarray(found, dtype=np.float32) if found is not None else None


def xgboost_reason(message: str) -> str:
    """The line of an XGBoost error that says what is wrong, without its source location."""
    lines = [line.strip() for line in message.splitlines() if line.strip() and not line.strip().startswith("Stack")]
    first = lines[0] if lines else message
    return first.split(": ", 1)[1] if first.startswith("[") and ": " in first else first


def predicted_classes(objective: str, raw) -> np.ndarray:
    """Class indices from a booster's predictions under a classification objective."""
    if objective == "multi:softprob":
        return np.argmax(raw, axis=1)
    if objective == "binary:logistic":
        return (raw > 0.5).astype(int)
    if objective == "binary:logitraw":
        return (raw > 0).astype(int)
    return np.rint(raw).astype(int)  # binary:hinge and multi:softmax answer the class


def train(algorithm: str, flags: Flags, prepared: Prepared, log: Callable[[str], None]) -> tuple[outputs.Outcome, dict]:
    schema = prepared.schema
    classification = schema.model_type == "classification"
    params = parameters(flags, len(schema.classes))
    training = matrix(prepared, prepared.training)
    evaluated_rows = prepared.validation or prepared.training
    evaluated = matrix(prepared, evaluated_rows) if prepared.validation else training
    if not prepared.validation:
        log("No validation data (--validation_data_path, or --preprocess with --validation_split): the metrics "
            "are measured on the training data.")
    watch = [(training, "train")] + ([(evaluated, "validation")] if prepared.validation else [])
    history: dict = {}
    rounds = flags.num_boost_round
    log(f"Training {rounds} rounds with {params}")
    try:
        booster = xgb.train(params, training, num_boost_round=rounds, evals=watch, evals_result=history,
                            verbose_eval=max(1, rounds // LOG_LINES))
    except xgb.core.XGBoostError as exc:
        raise FlagError(f"XGBoost refused the parameters {params}: {xgboost_reason(str(exc))}") from None
    labels = np.asarray(targets(schema, evaluated_rows))
    predictions = booster.predict(evaluated)
    if classification:
        metrics = {"accuracy": float(np.mean(predicted_classes(params["objective"], predictions) == labels))}
    else:
        metrics = {"rmse": math.sqrt(float(np.mean((predictions - labels) ** 2)))}
    measured = history.get("validation") or history.get("train") or {}
    metrics.update({name: float(values[-1]) for name, values in measured.items() if name not in metrics})
    outputs.Reporter().report(metrics, rounds)
    if prepared.test:
        tested = booster.predict(matrix(prepared, prepared.test))
        test_labels = np.asarray(targets(schema, prepared.test))
        shown = (f"accuracy = {np.mean(predicted_classes(params['objective'], tested) == test_labels):.4g}"
                 if classification else f"rmse = {math.sqrt(float(np.mean((tested - test_labels) ** 2))):.4g}")
        log(f"Test data: {shown}")
    with tempfile.TemporaryDirectory() as scratch:
        local = os.path.join(scratch, MODEL_FILE)
        booster.save_model(local)
        files.write_bytes_from(local, files.join(flags.job_dir, outputs.MODEL_DIR, MODEL_FILE))
    return outputs.Outcome(metrics, rounds), {"features": one_hot_names(schema), "xgboost_parameters": params}

"""A built-in algorithm's run: check the flags, read and preprocess the data, write
processed_data/ and artifacts/, train (TensorFlow's algorithms in keras_loop, XGBoost in
boosted_trees), and leave the model with its deployment_config.yaml in --job-dir/model.

A bad flag or unusable data ends the run with one line, `ERROR: ...`, and exit status 1: the
job fails with that line, as on the service.
"""

from __future__ import annotations

import os
import sys
import time

from . import files, outputs
from .flags import FlagError, Flags, parse, split_fractions
from .preprocess import DataError, Prepared, prepare, read_rows

# What each algorithm trains with: the framework its model is for (model versions name it).
FRAMEWORKS = {"linear_learner": "TENSORFLOW", "wide_deep_learner": "TENSORFLOW", "tab_net": "TENSORFLOW",
              "boosted_trees": "XGBOOST"}
ALGORITHM_VARIABLE = "AIPTRAIN_ALGORITHM"  # set by the algorithm's image
RUNTIME_VARIABLE = "AIPTRAIN_RUNTIME_VERSION"


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def main(argv: list[str]) -> int:
    algorithm = os.environ.get(ALGORITHM_VARIABLE, "")
    if algorithm not in FRAMEWORKS:
        print(f"ERROR: {ALGORITHM_VARIABLE} is [{algorithm}]: this image names no built-in algorithm "
              f"({', '.join(FRAMEWORKS)}).", file=sys.stderr, flush=True)
        return 2
    try:
        flags = parse(algorithm, argv)
        run(algorithm, flags)
    except (FlagError, DataError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def model_type(algorithm: str, flags: Flags) -> str:
    if algorithm == "boosted_trees":
        return "classification" if flags.objective.startswith(("binary:", "multi:")) else "regression"
    return str(flags.model_type)


def load(algorithm: str, flags: Flags) -> Prepared:
    """The three sets, read and preprocessed as the flags say."""
    header = bool(flags.values.get("data_has_header"))

    def rows(path_flag: str) -> list[list[str]] | None:
        path = flags.values[path_flag]
        if not path:
            return None
        return read_rows(files.read_text(path, path_flag), f"--{path_flag} [{path}]", header)

    training = rows("training_data_path")
    assert training is not None  # a required flag
    return prepare(training, rows("validation_data_path"), rows("test_data_path"), model_type(algorithm, flags),
                   bool(flags.preprocess), split_fractions(flags), weight_column=bool(flags.values.get("csv_weight")))


def run(algorithm: str, flags: Flags) -> outputs.Outcome:
    job_dir = flags.job_dir
    for note in flags.notes:
        log(f"NOTE: {note}")
    log(f"Reading {flags.training_data_path}")
    prepared = load(algorithm, flags)
    schema = prepared.schema
    kinds = [c.kind for c in schema.columns[1:]]
    log(f"{len(prepared.training)} training, {len(prepared.validation)} validation, {len(prepared.test)} test rows"
        f"{f' ({prepared.dropped} dropped by preprocessing)' if prepared.dropped else ''}; columns: "
        + ", ".join(f"{kinds.count(kind)} {kind}" for kind in dict.fromkeys(kinds)))
    if flags.preprocess:
        for name, text in outputs.processed_files(prepared).items():
            files.write_text(files.join(job_dir, outputs.PROCESSED_DIR, name), text)
    if algorithm == "boosted_trees":
        from .boosted_trees import train
    else:
        from .keras_loop import train
    outcome, extra = train(algorithm, flags, prepared, log)
    files.write_text(files.join(job_dir, outputs.ARTIFACTS_DIR, outputs.METADATA),
                     outputs.metadata(prepared, algorithm, extra))
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    config = outputs.deployment_config(files.join(job_dir, outputs.MODEL_DIR), FRAMEWORKS[algorithm],
                                       os.environ.get(RUNTIME_VARIABLE, ""), python,
                                       outputs.metric_labels(schema.model_type, outcome.metrics, outcome.step))
    files.write_text(files.join(job_dir, outputs.MODEL_DIR, outputs.DEPLOYMENT_CONFIG), config)
    shown = ", ".join(f"{name} = {value:.4g}" for name, value in outcome.metrics.items())
    log(f"Model written to {files.join(job_dir, outputs.MODEL_DIR)}: {shown} at step {outcome.step}")
    return outcome

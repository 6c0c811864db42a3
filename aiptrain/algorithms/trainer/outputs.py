"""What a built-in algorithm leaves in --job-dir besides its model, and the metrics it reports:
model/deployment_config.yaml (what `gcloud ai-platform versions create --config` takes, with the
final metrics as labels), artifacts/metadata.json (what preprocessing learned, for preprocessing
prediction inputs the same way), processed_data/ (the sets as trained on). Pure text here; the
writing is files.py's, the reporting cloudml-hypertune's (in the image)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .preprocess import Prepared, to_csv

MODEL_DIR, PROCESSED_DIR, ARTIFACTS_DIR, EXPERIMENT_DIR = "model", "processed_data", "artifacts", "experiment"
DEPLOYMENT_CONFIG = "deployment_config.yaml"
METADATA = "metadata.json"
PROCESSED_FILES = {"training": "training_data.csv", "validation": "validation_data.csv", "test": "test_data.csv"}


@dataclass
class Outcome:
    """What training measured: the final metrics (on the validation data, else the training data)
    and the step they were measured at."""

    metrics: dict[str, float]
    step: int


def deployment_config(model_uri: str, framework: str, runtime_version: str, python_version: str,
                      labels: dict[str, str]) -> str:
    """model/deployment_config.yaml: a model version's fields, every value a quoted string."""
    lines = [f"deploymentUri: {_quoted(model_uri)}", f"framework: {framework}", "labels:"]
    lines += [f"  {name}: {_quoted(value)}" for name, value in labels.items()]
    lines += [f"pythonVersion: {_quoted(python_version)}", f"runtimeVersion: {_quoted(runtime_version)}"]
    return "\n".join(lines) + "\n"


def _quoted(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def metric_labels(model_type: str, metrics: dict[str, float], step: int) -> dict[str, str]:
    """The labels a job's final metrics give the model: accuracy as a percentage (the service's
    readers divided it by 100) or the regression metric, and the step they were measured at."""
    if model_type == "classification":
        return {"accuracy": f"{100 * metrics['accuracy']:.4g}", "global_step": str(step)}
    return {"rmse": f"{metrics['rmse']:.6g}", "global_step": str(step)}


def metadata(prepared: Prepared, algorithm: str, extra: dict | None = None) -> str:
    """artifacts/metadata.json."""
    data = {"algorithm": algorithm, **prepared.schema.to_dict(),
            "rows": {"training": len(prepared.training), "validation": len(prepared.validation),
                     "test": len(prepared.test), "dropped_by_preprocessing": prepared.dropped},
            **(extra or {})}
    return json.dumps(data, indent=2) + "\n"


def processed_files(prepared: Prepared) -> dict[str, str]:
    """processed_data/'s files (name -> CSV text), a set with no rows left out."""
    sets = {"training": prepared.training, "validation": prepared.validation, "test": prepared.test}
    return {PROCESSED_FILES[name]: to_csv(rows) for name, rows in sets.items() if rows}


class Reporter:
    """Reports metrics for hyperparameter tuning, as the service's algorithms did (every tag at
    each evaluation: `accuracy` and `loss`, or `rmse` and `loss`)."""

    def __init__(self) -> None:
        try:
            import hypertune  # cloudml-hypertune, in the runtime image
        except ImportError:  # a test on the host: nothing to report to
            self._tune = None
        else:
            self._tune = hypertune.HyperTune()

    def report(self, metrics: dict[str, float], step: int) -> None:
        if self._tune is None:
            return
        for tag, value in metrics.items():
            self._tune.report_hyperparameter_tuning_metric(hyperparameter_metric_tag=tag, metric_value=value,
                                                           global_step=step)

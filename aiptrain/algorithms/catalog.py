"""The built-in algorithms AI Platform ran from gcr.io/cloud-ml-algos, as this machine builds
them: their names, the image names they are tagged with, and the labels an algorithm's image
declares. Pure: no Docker here (aiptrain/algorithms/images.py builds them).

What a job's trainingOutput says of a built-in algorithm comes from its image's labels
(`output_of`), never from its name: any image that declares these labels is one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aiptrain.errors import ValidationError
from aiptrain.model import BuiltInAlgorithmOutput

REGISTRY = "gcr.io/cloud-ml-algos"
RUNTIME_VERSION = "2.11"  # the runtime image the algorithms' images are built from
ALGORITHM_LABEL = "aiptrain.built-in-algorithm"  # the trainer's name (linear_learner, ...)
FRAMEWORK_LABEL = "aiptrain.built-in-algorithm.framework"  # TENSORFLOW, XGBOOST
# Stamped on every runtime image (runtime.Dockerfile), so an algorithm's image, built from one, has them.
RUNTIME_LABEL, PYTHON_LABEL = "aiptrain.runtime-version", "aiptrain.python"
SERVICE_TAG = "latest"


@dataclass(frozen=True)
class Algorithm:
    name: str  # what the image's trainer runs (AIPTRAIN_ALGORITHM)
    title: str
    repositories: tuple[str, ...]  # the service's image names under REGISTRY
    framework: str

    @property
    def images(self) -> tuple[str, ...]:
        """Every name the image is tagged with, the first the one it is built as."""
        return tuple(f"{REGISTRY}/{repository}:{SERVICE_TAG}" for repository in self.repositories)

    @property
    def image(self) -> str:
        return self.images[0]


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a for a in (
        # The GPU images are the same image here: a job asking for a GPU gets one where the engine has one.
        Algorithm("linear_learner", "linear learner", ("linear_learner_cpu", "linear_learner_gpu"), "TENSORFLOW"),
        Algorithm("wide_deep_learner", "wide and deep", ("wide_deep_learner_cpu", "wide_deep_learner_gpu"),
                  "TENSORFLOW"),
        Algorithm("boosted_trees", "XGBoost", ("boosted_trees",), "XGBOOST"),
        Algorithm("tab_net", "TabNet", ("tab_net",), "TENSORFLOW"),
    )
}


def algorithm_of(image_uri: str | None) -> Algorithm | None:
    """The algorithm an image name is the service's name of (`gcr.io/cloud-ml-algos/boosted_trees`,
    with or without `:latest`); None for any other image."""
    if not image_uri:
        return None
    name = image_uri if image_uri.rsplit("/", 1)[-1].count(":") else f"{image_uri}:{SERVICE_TAG}"
    return next((a for a in ALGORITHMS.values() if name in a.images), None)


def lookup(names: tuple[str, ...] | list[str]) -> list[Algorithm]:
    """The algorithms `names` name (an algorithm's name, or one of its image names), all checked
    first; every algorithm when none is named."""
    if not names:
        return list(ALGORITHMS.values())
    chosen = []
    for name in names:
        found = ALGORITHMS.get(name) or algorithm_of(name) or algorithm_of(f"{REGISTRY}/{name}")
        if found is None:
            known = ", ".join(ALGORITHMS)
            raise ValidationError(f"Unknown built-in algorithm [{name}]: choose one of {known} (or an image name "
                                  f"such as {ALGORITHMS['linear_learner'].image}).")
        chosen.append(found)
    return list(dict.fromkeys(chosen))


def output_of(labels: Mapping[str, str] | None) -> BuiltInAlgorithmOutput | None:
    """What a job's trainingOutput.builtInAlgorithmOutput says at submit, from the labels of the
    image its master runs; None for an image that declares no built-in algorithm."""
    if not labels or not labels.get(ALGORITHM_LABEL):
        return None
    return BuiltInAlgorithmOutput(framework=labels.get(FRAMEWORK_LABEL) or None,
                                  runtime_version=labels.get(RUNTIME_LABEL) or None,
                                  python_version=labels.get(PYTHON_LABEL) or None)

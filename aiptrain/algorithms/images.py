"""Building the built-in algorithms' images: FROM the runtime image of RUNTIME_VERSION (built
first when missing, as a submit builds a runtime), plus the trainer package, tagged with every
name the service gave the algorithm. No network: nothing is installed, only copied.

An image records what it was built from (RECIPE_LABEL): the Dockerfile, the trainers' sources,
the runtime's own recipe. One built by an older aiptrain is rebuilt once, as a stale runtime is.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import tempfile
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path

from aiptrain import runtimes
from aiptrain.algorithms.catalog import ALGORITHM_LABEL, FRAMEWORK_LABEL, RUNTIME_VERSION, Algorithm
from aiptrain.backends.engine import connect, inspect_image
from aiptrain.runtime_catalog import RUNTIMES, Runtime

RECIPE_LABEL = "aiptrain.built-in-algorithm.recipe"
PACKAGE_IN_IMAGE = "aiptrain_algorithms"
DOCKERFILE = "algorithm.Dockerfile"
# What each trainer imports: the build checks they import on the image's Python.
IMPORTS = {"TENSORFLOW": "keras_loop", "XGBOOST": "boosted_trees"}


def base_runtime() -> Runtime:
    return RUNTIMES[RUNTIME_VERSION]


def _trainer_sources() -> dict[str, str]:
    """The trainer package's modules: file name -> text."""
    package = resources.files("aiptrain.algorithms.trainer")
    return {entry.name: entry.read_text() for entry in sorted(package.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".py")}


def _dockerfile() -> str:
    return resources.files("aiptrain.algorithms").joinpath(DOCKERFILE).read_text()


def recipe(algorithm: Algorithm) -> str:
    """A digest of what the algorithm's image is built from."""
    text = json.dumps([_dockerfile(), _trainer_sources(), algorithm.name, algorithm.framework,
                       runtimes.recipe(base_runtime())], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def is_current(algorithm: Algorithm, labels: Mapping[str, str] | None) -> bool:
    """The image (its labels; None: the engine lacks it) was built by this aiptrain's recipe."""
    return labels is not None and labels.get(RECIPE_LABEL) == recipe(algorithm)


def image_is_current(algorithm: Algorithm) -> bool:
    found = inspect_image(connect(), algorithm.image)
    return is_current(algorithm, found.labels if found else None)


def ensure_image(algorithm: Algorithm, cache_dir: Path, progress: Callable[[str], None]) -> bool:
    """At submit, as `docker run` pulls: build the algorithm's image when the engine lacks it (or
    an older aiptrain built it); True when it was built. One build at a time per installation."""
    if image_is_current(algorithm):
        return False
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / "algorithm-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image_is_current(algorithm):
            return False
        why = "was built by an older aiptrain" if runtimes.image_exists(algorithm.image) else \
            "is not on this Docker engine"
        progress(f"Built-in algorithm image [{algorithm.image}] {why}: building it now, once (seconds; "
                 "AIPTRAIN_AUTO_BUILD=0 refuses instead).")
        build_image(algorithm, cache_dir, progress)
    return True


def build_image(algorithm: Algorithm, cache_dir: Path, progress: Callable[[str], None] = lambda line: None) -> str:
    """Build (or rebuild) the algorithm's image, its runtime image first where that is missing;
    tag it with each of the service's names; return the first."""
    rt = base_runtime()
    if not runtimes.image_is_current(rt):
        runtimes.ensure_image(rt, cache_dir, progress, f"the built-in {algorithm.title}'s runtime")
    api = connect(timeout=600)
    with tempfile.TemporaryDirectory(prefix="aiptrain-algorithm-") as context:
        (Path(context) / "Dockerfile").write_text(_dockerfile())
        package = Path(context) / PACKAGE_IN_IMAGE
        package.mkdir()
        for name, text in _trainer_sources().items():
            (package / name).write_text(text)
        progress(f"Building {algorithm.image} from {rt.image}")
        stream = api.build(
            path=context, tag=algorithm.image, rm=True, forcerm=True, decode=True,
            buildargs={"BASE_IMAGE": rt.image, "ALGORITHM": algorithm.name, "RUNTIME_VERSION": rt.version,
                       "IMPORTS": f"{PACKAGE_IN_IMAGE}.{IMPORTS[algorithm.framework]}"},
            labels={ALGORITHM_LABEL: algorithm.name, FRAMEWORK_LABEL: algorithm.framework,
                    RECIPE_LABEL: recipe(algorithm)},
        )
        runtimes.follow_build(stream, algorithm.image, progress)
    for name in algorithm.images[1:]:
        repository, _, tag = name.rpartition(":")
        api.tag(algorithm.image, repository, tag)
    return algorithm.image

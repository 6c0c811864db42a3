"""Vertex AI's prebuilt training images, mapped to the runtime images built here, and back.

`pythonPackageSpec.executorImageUri` names one of Google's prebuilt containers
(`us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-11.py310:latest`, the older
`gcr.io/cloud-aiplatform/training/tf-cpu.2-3:latest`, `sklearn-cpu.1-0`, `xgboost-cpu.1-1`,
`pytorch-gpu.1-13`, AI Platform's `gcr.io/cloud-ml-public/training/pytorch-cpu.1-4`; also
`europe-`/`asia-` hosts). None can be pulled here: each is run by the runtime version whose
frameworks it held, as AI Platform's runtime versions are; every PyTorch image (CPU, GPU or XLA,
any release) by the one PyTorch runtime, on CPU. An image a team maps itself (`aiptrain runtimes
add URI --image IMAGE`) is taken first. The other way (`prebuilt_image`), an AI Platform runtime
version names the prebuilt TensorFlow image of its release, for `aiptrain jobs convert`.
Pure rules: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiptrain.errors import ValidationError
from aiptrain.runtime_catalog import PYTORCH, RUNTIMES, SERVICE_PINS, TORCH

# (host)/(repository path)/(framework)-(cpu|gpu|xla).(major)-(minor)[.pyNN][:tag]
PREBUILT = re.compile(
    r"(?:[a-z0-9-]+-docker\.pkg\.dev/vertex-ai/training|(?:[a-z]+\.)?gcr\.io/cloud-aiplatform/training"
    r"|gcr\.io/cloud-ml-public/training)/"
    r"(?P<framework>tf|tf2|sklearn|scikit-learn|xgboost|pytorch)-(?P<flavour>cpu|gpu|xla)"
    r"\.(?P<major>\d+)-(?P<minor>\d+)(?:\.py\d+)?(?::[\w.-]+)?"
)
FRAMEWORK_PINS = {"sklearn": 1, "scikit-learn": 1, "xgboost": 2}  # index in SERVICE_PINS' tuples
NEWEST_TF = max((v for v in SERVICE_PINS if v.startswith("2.")), key=lambda v: int(v.split(".")[1]))
# Vertex AI's prebuilt TensorFlow training images with the Python 3.7 of AI Platform's runtimes
# (`tf-cpu.2-8:latest`; the `.py310` ones came later): 1.15 and 2.1-2.11, but none of 2.10
# (cloud.google.com/vertex-ai/docs/training/pre-built-containers).
TRAINING_IMAGES = "us-docker.pkg.dev/vertex-ai/training"
TF_IMAGE_RELEASES = ("1.15", *(f"2.{minor}" for minor in range(1, 12) if minor != 10))
# The prebuilt PyTorch training image `aiptrain jobs convert` names for runtime pytorch-2.13.
PYTORCH_IMAGE_RELEASE = "2.4"


@dataclass(frozen=True)
class Executor:
    runtime_version: str  # the runtime that runs it
    note: str | None = None  # one line when it runs other releases than the image held


def is_prebuilt(uri: str) -> bool:
    return PREBUILT.fullmatch(uri.strip()) is not None


def executor(uri: str, mapped: dict[str, dict] | None = None) -> Executor:
    """The runtime that runs a prebuilt executor image; ValidationError naming what to do for
    one that is not a prebuilt image, or a framework no runtime here holds."""
    if mapped and uri in mapped:
        return Executor(uri)
    match = PREBUILT.fullmatch(uri.strip())
    if match is None:
        raise ValidationError(
            f"executorImageUri [{uri}] is not one of Vertex AI's prebuilt training images "
            "(us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-11.py310:latest and the like): use containerSpec for "
            f"your own image, or map it with `aiptrain runtimes add {uri} --image IMAGE`."
        )
    framework, release = match["framework"], (int(match["major"]), int(match["minor"]))
    if framework == "pytorch":
        return _pytorch(uri, match["flavour"])
    if framework in ("tf", "tf2"):
        return _tensorflow(uri, release)
    return _by_pin(uri, framework, release)


def _pytorch(uri: str, flavour: str) -> Executor:
    """Every PyTorch image runs on the one PyTorch runtime: its CPU build, whatever release and
    accelerator the image held (a trainer written for CUDA or XLA devices must fall back to CPU)."""
    torch = TORCH.split("+")[0]
    on_cpu = "" if flavour == "cpu" else f", on CPU: the {flavour.upper()} build is not here"
    return Executor(PYTORCH, f"NOTE: [{uri}] runs on runtime {PYTORCH} (PyTorch {torch}, CPU build{on_cpu}).")


def _tensorflow(uri: str, release: tuple[int, int]) -> Executor:
    version = f"{release[0]}.{release[1]}"
    if version in RUNTIMES:
        return Executor(version)
    if release[0] == 2 and release > (2, int(NEWEST_TF.split(".")[1])):
        return Executor(NEWEST_TF, f"NOTE: [{uri}] runs on runtime {NEWEST_TF} (TensorFlow "
                                   f"{SERVICE_PINS[NEWEST_TF][0]}), the newest built here.")
    raise ValidationError(f"executorImageUri [{uri}] names TensorFlow {version}, which no runtime here holds: "
                          f"use tf-cpu.2-1 to tf-cpu.{NEWEST_TF.replace('.', '-')}.")


def _by_pin(uri: str, framework: str, release: tuple[int, int]) -> Executor:
    """The newest runtime whose pinned release of the framework is the image's, else the newest
    that pinned an older one."""
    index = FRAMEWORK_PINS[framework]

    def pinned(version: str) -> tuple[int, ...]:
        pin = SERVICE_PINS[version][index] or "0"
        return tuple(int(part) for part in re.findall(r"\d+", pin))[:2]

    candidates = sorted((v for v in SERVICE_PINS if v.startswith("2.")), key=lambda v: int(v.split(".")[1]),
                        reverse=True)
    for version in candidates:
        if pinned(version) == release:
            return Executor(version)
    older = [v for v in candidates if pinned(v) <= release]
    if not older:
        raise ValidationError(f"executorImageUri [{uri}] names a release older than any runtime here holds.")
    shown = ".".join(map(str, release))
    return Executor(older[0], f"NOTE: [{uri}] runs on runtime {older[0]} ({framework} "
                              f"{SERVICE_PINS[older[0]][index]}), the nearest to {shown} built here.")


@dataclass(frozen=True)
class Image:
    uri: str  # a prebuilt executor image
    note: str | None = None  # one line when it holds another release than the runtime did


def prebuilt_image(runtime_version: str, gpu: bool = False) -> Image:
    """The prebuilt training image that runs what `runtime_version` ran: `tf-cpu.2-11:latest`
    for 2.11 (`tf-gpu` for replicas with GPUs); the nearest release where Vertex AI has none.
    A runtime version that is itself a prebuilt image (mapped with `aiptrain runtimes add`) is
    that image. `executor` maps each image back to the runtime version."""
    if is_prebuilt(runtime_version):
        return Image(runtime_version.strip())
    flavour = "gpu" if gpu else "cpu"
    if runtime_version == PYTORCH:
        uri = f"{TRAINING_IMAGES}/pytorch-{flavour}.{PYTORCH_IMAGE_RELEASE.replace('.', '-')}.py310:latest"
        return Image(uri, f"runtimeVersion {runtime_version} (PyTorch {TORCH.split('+')[0]}) is aiptrain's own: {uri} "
                          f"(PyTorch {PYTORCH_IMAGE_RELEASE}) is given; pick the prebuilt image the trainer needs.")
    release = _nearest_release(runtime_version)
    uri = f"{TRAINING_IMAGES}/tf-{flavour}.{release.replace('.', '-')}:latest"
    if release == runtime_version:
        return Image(uri)
    if runtime_version in RUNTIMES and runtime_version != "minimal":
        return Image(uri, f"runtimeVersion {runtime_version} has no prebuilt training image on Vertex AI: "
                          f"{uri} (TensorFlow {release}) is the nearest; check the trainer on it.")
    return Image(uri, f"runtimeVersion {runtime_version} is aiptrain's own, not one of Google's: {uri} "
                      f"(TensorFlow {release}) is given; pick the prebuilt image the trainer needs.")


def _nearest_release(runtime_version: str) -> str:
    """The image release for a runtime version: its own, else the next one up within its major
    version (2.10 -> 2.11, 1.14 -> 1.15), else the newest."""
    if runtime_version in TF_IMAGE_RELEASES:
        return runtime_version
    try:
        wanted = tuple(int(part) for part in runtime_version.split("."))
    except ValueError:
        return TF_IMAGE_RELEASES[-1]
    later = [r for r in TF_IMAGE_RELEASES if r.split(".")[0] == str(wanted[0])
             and tuple(int(part) for part in r.split(".")) > wanted]
    return later[0] if later else TF_IMAGE_RELEASES[-1]

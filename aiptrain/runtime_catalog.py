"""Every runtime version AI Platform Training offered, and what ours run: pure data and rules,
no Docker (the image builder is aiptrain/runtimes.py).

AI Platform's runtime versions pinned TensorFlow, scikit-learn, XGBoost and pandas (the
"runtime version list", SOURCE_URL) and ran Python 3.7 from 1.15 on (2.7/3.5 before).
Ours install those exact releases wherever the base image's Python has wheels for them:
  - 2.5-2.11 on Debian bullseye (Python 3.9): the real versions.
  - 2.1-2.4 on bullseye: TensorFlow 2.1-2.4 have no Python 3.9 wheels, so the nearest
    releases that do (TensorFlow 2.5.3 ...), said in one line at submit (`Runtime.note`).
  - 1.x on bullseye too, without TensorFlow: TensorFlow 1.x needs Python 3.7, which no Debian
    reachable here ships. scikit-learn, XGBoost and pandas trainers (what most 1.x samples are)
    run on the nearest releases; `import tensorflow` ends in one line naming a 2.x runtime.
  - Where those releases removed names the service's had (`sklearn.externals.joblib`), the
    image gets them back (COMPAT, installed by aiptrain/runtime/aiptrain_compat.py).
  - minimal: Debian bookworm's Python 3.11 and pip, nothing else.
  - pytorch-2.13: PyTorch's CPU build on bookworm, which runs Vertex AI's (and AI Platform's)
    prebuilt PyTorch images (aiptrain/vertex/images.py). AI Platform had no PyTorch runtime
    version; it is built when a job needs it, not with the others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from aiptrain.errors import ValidationError
from aiptrain.settings import base_image, image_repository

SOURCE_URL = "https://cloud.google.com/ai-platform/training/docs/runtime-version-list"
FRAMEWORKS = ("tensorflow", "scikit-learn", "xgboost", "pandas")
# Published only as an sdist: the image builder builds its wheel on the host.
HYPERTUNE = "cloudml-hypertune==0.1.0.dev6"
# What AI Platform's framework images gave trainers beside the frameworks, which published
# trainers import without declaring: Cloud Storage and Google API clients, their credentials,
# and gcsfs (pandas' `read_csv('gs://...')`). Unpinned: resolved within the runtime's own
# constraints (protobuf, numpy) at build; the image's label records what was installed.
GOOGLE_LIBRARIES = ("google-cloud-storage", "google-api-python-client", "google-auth", "gcsfs")
# The modules trainers import from those distributions: each image build checks they import.
_MODULES = {"tensorflow": "tensorflow", "scikit-learn": "sklearn", "xgboost": "xgboost", "pandas": "pandas",
            "torch": "torch"}
GOOGLE_MODULES = ("hypertune", "google.cloud.storage", "googleapiclient", "google.auth", "gcsfs")
@dataclass(frozen=True)
class Base:
    name: str  # bookworm, bullseye
    python: str  # major.minor of its Python: the replicas' Python
    description: str
    registry_image: str | None = None  # pulled as is; None: built by scripts/build-base-image.sh

    @property
    def image(self) -> str:
        return self.registry_image or base_image(self.name)

    @property
    def how_to_get(self) -> str:
        if self.registry_image:
            return f"`docker pull {self.registry_image}` on a machine with a registry"
        return f"`scripts/build-base-image.sh {self.name}` (debootstrap, no registry needed)"


BASES = {
    b.name: b
    for b in (
        Base("bookworm", "3.11", "Debian bookworm"),
        Base("bullseye", "3.9", "Debian bullseye"),
    )
}


@dataclass(frozen=True)
class Surface:
    """Names a framework release removed that trainers of older runtimes imported: given back
    (aiptrain_compat.SURFACES[name]) where the service ran a release before `removed_in` and
    the image runs one from it on."""

    name: str
    framework: str
    removed_in: str
    names: str  # what the NOTE and docs list
    requires: tuple[str, ...] = ()  # distributions the names come from that the image may lack


COMPAT = (
    Surface("sklearn-externals", "scikit-learn", "0.23", "sklearn.externals.joblib and .six", ("six",)),
    Surface("sklearn-paths", "scikit-learn", "0.24",
            "scikit-learn's module paths before 0.24 (sklearn.ensemble.forest, sklearn.metrics.scorer, ...)"),
    Surface("pandas-1.0", "pandas", "1.0", "as_matrix, get_value and set_value of DataFrame and Series"),
    Surface("keras-2.4", "tensorflow", "2.4", "tf.keras.utils.multi_gpu_model"),
    Surface("keras-2.5", "tensorflow", "2.5", "tf.keras.experimental.LinearCosineDecay and NoisyLinearCosineDecay"),
)
# What a TensorFlow 1.x trainer is pointed to where its runtime has no TensorFlow: the oldest 2.x
# (its TensorFlow runs 1.x code through tf.compat.v1).
TENSORFLOW_2_FOR_1X = "2.1"


@dataclass(frozen=True)
class Runtime:
    version: str
    base: Base
    installs: dict[str, str]  # framework -> the release our image installs
    service: dict[str, str] = field(default_factory=dict)  # framework -> what AI Platform pinned
    extra: tuple[str, ...] = ()  # further pip requirements (constraints, cloudml-hypertune)
    mapped_image: str | None = None  # `aiptrain runtimes add`: a team's own image
    compat: tuple[Surface, ...] = ()  # names given back to its trainers (COMPAT)

    @property
    def python(self) -> str:
        return self.base.python

    @property
    def image(self) -> str:
        return self.mapped_image or f"{image_repository()}:{self.version}"

    @property
    def packages(self) -> tuple[str, ...]:
        """pip requirement strings installed into the image."""
        pins = tuple(f"{_distribution(fw, v)}=={v}" for fw, v in self.installs.items())
        return pins + self.extra

    @property
    def provides(self) -> frozenset[str]:
        """Distributions preinstalled in the image (canonical names): a trainer's requirement
        of one of them is served by the image, as on AI Platform, not installed again."""
        names = {_requirement_name(p) for p in self.packages if not _is_constraint(p)}
        return frozenset(names | {alias for name in names for alias in _PROVIDES_ALSO.get(name, ())})

    @property
    def imports(self) -> tuple[str, ...]:
        """Modules the image must import (checked at build): its frameworks' and the Google libraries'."""
        if not self.installs:
            return ()
        return tuple(_MODULES[fw] for fw in self.installs) + GOOGLE_MODULES

    @property
    def bounds(self) -> tuple[str, ...]:
        """The upper bounds the image was resolved within (`numpy<1.24`)."""
        return tuple(p for p in self.packages if _is_constraint(p))

    @property
    def lacks_tensorflow(self) -> bool:
        """The service's runtime had TensorFlow; ours cannot (1.x: no Python 3.7 here)."""
        return "tensorflow" in self.service and "tensorflow" not in self.installs

    @property
    def note(self) -> str | None:
        """One line for submit when the image runs other releases than AI Platform did, and what
        it gives back to the trainers of that version."""
        differs = [fw for fw in FRAMEWORKS if fw in self.installs and self.installs[fw] != self.service.get(fw)]
        if not differs and not self.lacks_tensorflow:
            return None
        runs = ", ".join(f"{_TITLE[fw]} {self.installs[fw]}" for fw in differs)
        if differs:
            runs += f", the nearest release{'s' if len(differs) > 1 else ''} for Python {self.python}"
        if self.lacks_tensorflow:
            runs = f"{runs}, and no TensorFlow" if differs else "no TensorFlow"
        theirs = ", ".join(f"{_TITLE[fw]} {self.service[fw]}" for fw in FRAMEWORKS
                           if fw in self.service and self.installs.get(fw) != self.service[fw])
        line = f"NOTE: runtime {self.version} runs {runs} (AI Platform ran {theirs})"
        if self.lacks_tensorflow:
            line += f"; a trainer that imports tensorflow fails: try --runtime-version {TENSORFLOW_2_FOR_1X}"
        if self.compat:
            line += "; given back for its trainers: " + "; ".join(surface.names for surface in self.compat)
        return line + "."

    @property
    def without_tensorflow(self) -> str:
        """The one line an uncaught `import tensorflow` ends with in an image that lacks it."""
        if not self.lacks_tensorflow:
            return ""
        return (
            f"ERROR: runtime {self.version} has no TensorFlow here: TensorFlow {self.service['tensorflow']} has no "
            f"build for Python {self.python}, and no older Python is to be had. Try --runtime-version "
            f"{TENSORFLOW_2_FOR_1X} (TensorFlow "
            f"2 runs 1.x code through tf.compat.v1), or map a TensorFlow 1.x image with "
            f"`aiptrain runtimes add {self.version} --image IMAGE`."
        )

    @property
    def compat_line(self) -> str | None:
        """The image's aiptrain-compat.pth line (Python runs it at every start); None: nothing to give back."""
        if not self.compat and not self.lacks_tensorflow:
            return None
        arguments = [repr(surface.name) for surface in self.compat]
        if self.lacks_tensorflow:
            arguments.append(f"without_tensorflow={self.without_tensorflow!r}")
        return f"import aiptrain_compat; aiptrain_compat.install({', '.join(arguments)})"


_TITLE = {"tensorflow": "TensorFlow", "scikit-learn": "scikit-learn", "xgboost": "XGBoost", "pandas": "pandas"}
# `tensorflow-cpu` installs the same `tensorflow` module at a quarter of the size: a trainer
# asking for `tensorflow` runs on the image's build instead of pulling the GPU build.
_PROVIDES_ALSO = {"tensorflow-cpu": ("tensorflow",)}


def _distribution(framework: str, version: str) -> str:
    if framework == "tensorflow" and _release(version) >= (1, 15):  # tensorflow-cpu starts at 1.15
        return "tensorflow-cpu"
    return framework


def _is_constraint(requirement: str) -> bool:
    """An upper bound only (`numpy<1.24`): keeps old frameworks importable, provides nothing."""
    return bool(re.fullmatch(r"[A-Za-z0-9._-]+<[\d.]+", requirement))


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


# AI Platform's pins, from the runtime version list (SOURCE_URL):
# version: (TensorFlow, scikit-learn, XGBoost, pandas); None where the runtime had none.
SERVICE_PINS: dict[str, tuple[str | None, ...]] = {
    "2.11": ("2.11.0", "1.0.2", "1.6.2", "1.3.5"),
    "2.10": ("2.10.0", "1.0.2", "1.6.1", "1.3.5"),
    "2.9": ("2.9.1", "1.0.2", "1.6.1", "1.3.5"),
    "2.8": ("2.8.0", "1.0.2", "1.5.2", "1.3.5"),
    "2.7": ("2.7.0", "1.0.1", "1.5.0", "1.3.4"),
    "2.6": ("2.6.0", "0.24.2", "1.4.2", "1.3.2"),
    "2.5": ("2.5.0", "0.24.2", "1.4.2", "1.2.4"),
    "2.4": ("2.4.0", "0.24.0", "1.3.1", "1.1.5"),
    "2.3": ("2.3.0", "0.23.2", "1.2.0", "1.1.1"),
    "2.2": ("2.2.0", "0.22.2", "1.1.1", "1.0.4"),
    "2.1": ("2.1.0", "0.22.1", "0.90", "0.25.3"),
    "1.15": ("1.15.0", "0.20.4", "0.90", "0.24.2"),
    "1.14": ("1.14.0", "0.20.2", "0.82", "0.24.2"),
    "1.13": ("1.13.1", "0.20.2", "0.81", "0.24.0"),
    "1.12": ("1.12.0", "0.20.0", "0.80", "0.23.4"),
    "1.11": ("1.11.0", "0.19.1", "0.72", "0.22.0"),
    "1.10": ("1.10.0", "0.19.1", "0.72", "0.22.0"),
    "1.9": ("1.9.0", "0.19.1", "0.72", "0.22.0"),
    "1.8": ("1.8.0", "0.19.1", "0.72", "0.22.0"),
    "1.7": ("1.7.0", "0.19.1", "0.72", "0.22.0"),
    "1.6": ("1.6.0", "0.19.1", "0.72", "0.22.0"),
    "1.5": ("1.5.0", "0.19.1", "0.72", "0.22.0"),
    "1.4": ("1.4.0", "0.19.1", "0.72", "0.22.0"),
    "1.2": ("1.2.0", None, None, None),
    "1.0": ("1.0.1", None, None, None),
}

# Per base Python, per framework: (the oldest release with wheels for it, the release that
# stands in for older pins: the final patch of that minor series). Checked with
# `pip download --only-binary=:all: --python-version ...`.
_NEAREST = {
    "3.9": {
        "tensorflow": ("2.5.0", "2.5.3"), "scikit-learn": ("0.24.0", "0.24.2"),
        "xgboost": ("0.80", "0.90"), "pandas": ("1.1.3", "1.1.5"),
    },
}


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def _installs(service: dict[str, str], python: str) -> dict[str, str]:
    """The service's pin where the base's Python has a wheel for it, else the nearest that has."""
    installs = {}
    for fw, pin in service.items():
        oldest, stand_in = _NEAREST[python][fw]
        installs[fw] = pin if _release(pin) >= _release(oldest) else stand_in
    return installs


def _compat(service: dict[str, str], installs: dict[str, str]) -> tuple[Surface, ...]:
    """The surfaces whose names the service's releases had and ours removed."""
    return tuple(
        surface for surface in COMPAT
        if surface.framework in service and surface.framework in installs
        and _release(service[surface.framework]) < _release(surface.removed_in) <= _release(installs[surface.framework])
    )


def _service_runtime(version: str) -> Runtime:
    service = {fw: v for fw, v in zip(FRAMEWORKS, SERVICE_PINS[version], strict=False) if v}
    base = BASES["bullseye"]
    # TensorFlow 1.x has no wheels for the base's Python: the 1.x images hold the rest.
    wanted = {fw: v for fw, v in service.items() if version.startswith("2.") or fw != "tensorflow"}
    installs = _installs(wanted, base.python)
    compat = _compat(service, installs)
    constraints = _CONSTRAINTS[version.split(".")[0]] + _VERSION_CONSTRAINTS.get(version, ())
    if _release(installs.get("scikit-learn", "1")) < (1,):
        constraints += _SCIKIT_LEARN_0_CONSTRAINTS
    requires = tuple(dict.fromkeys(r for surface in compat for r in surface.requires))
    return Runtime(version, base, installs, service,
                   extra=(*constraints, HYPERTUNE, *GOOGLE_LIBRARIES, *requires), compat=compat)


# Upper bounds the frameworks of that era did not declare but need: numpy 1.24 dropped
# np.object/np.bool, protobuf 4 breaks TensorFlow's generated code. The 1.x images keep the
# numpy of runtime 2.1's (1.19), under which its scikit-learn, XGBoost and pandas already run.
_CONSTRAINTS = {"2": ("numpy<1.24", "protobuf<3.20"), "1": ("numpy<1.20", "protobuf<3.20")}
# scikit-learn 0.24 imports scipy.linalg.pinv2, which scipy 1.9 removed (sklearn.cross_decomposition
# and everything importing it fail); 1.7 is the release of its day.
_SCIKIT_LEARN_0_CONSTRAINTS = ("scipy<1.8",)
# TensorFlow 2.6.0 asked for keras~=2.6, which newer Keras releases satisfy and break.
_VERSION_CONSTRAINTS = {"2.6": ("keras<2.7", "tensorflow-estimator<2.7")}


# PyTorch's CPU build: PyPI's Linux torch is the CUDA one, which does not import without GBs of
# nvidia-* wheels. The `+cpu` pin matches only a CPU wheel pip is pointed at (PIP_FIND_LINKS=DIR
# holding torch-2.13.0+cpu-cp311-*.whl, or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu),
# never PyPI's. numpy: optional for torch, which warns at every start without it.
TORCH = "2.13.0+cpu"
PYTORCH = "pytorch-2.13"

RUNTIMES: dict[str, Runtime] = {
    **{v: _service_runtime(v) for v in SERVICE_PINS},
    "minimal": Runtime("minimal", BASES["bookworm"], {}),
    PYTORCH: Runtime(PYTORCH, BASES["bookworm"], {"torch": TORCH}, extra=("numpy", HYPERTUNE, *GOOGLE_LIBRARIES)),
}


def runtime(version: str, given_as: str = "--runtime-version", mapped: dict[str, dict] | None = None) -> Runtime:
    """The runtime a version names: a team's mapped image first (`aiptrain runtimes add`),
    then the catalog."""
    if mapped and version in mapped:
        entry = mapped[version]
        python = entry.get("python", "")
        base = Base(f"image {entry['image']}", python, f"the mapped image {entry['image']}")
        return Runtime(version, base, {}, mapped_image=entry["image"])
    try:
        return RUNTIMES[version]
    except KeyError:
        known = ", ".join(_known_versions(mapped))
        raise ValidationError(
            f"Unknown {given_as} [{version}]: choose one of {known} (`aiptrain runtimes list`)."
        ) from None


def _known_versions(mapped: dict | None) -> list[str]:
    return [*RUNTIMES, *(v for v in mapped or {} if v not in RUNTIMES)]



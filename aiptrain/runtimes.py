"""Runtime images: building them, and the versions a team mapped to its own images.

What each runtime version installs is the catalog's (aiptrain/runtime_catalog.py, pure);
this module touches Docker. Images are built offline: the host downloads a wheelhouse for
the base image's Python and the engine's platform (building pure-Python wheels from sdists
where a project publishes no wheel, such as cloudml-hypertune), and the Dockerfile shipped
with aiptrain installs from it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from pathlib import Path

from aiptrain import wheelhouse
from aiptrain.backends.engine import connect
from aiptrain.dependencies import Image, canonical_name
from aiptrain.errors import EnvironmentLacks, EnvironmentNotReady, ValidationError
from aiptrain.runtime_catalog import RUNTIMES, SOURCE_URL, Runtime, image_repository, runtime
from aiptrain.validation import validate_image_reference, validate_runtime_version_name

__all__ = ["RUNTIMES", "SOURCE_URL", "Runtime", "image_repository", "runtime", "lookup", "build_image"]

# Every distribution the image installed, `name==version` space-separated: what a trainer's own
# requirements resolve within at submit (aiptrain.requirements).
INSTALLED_LABEL = "aiptrain.installed"
# What an image was built from (the Dockerfile, the requirements, the base): an image whose recipe
# differs from this aiptrain's (built by an older one) is rebuilt once, as a missing one is built.
RECIPE_LABEL = "aiptrain.recipe"
# The base script's `recipe=N` line, stamped on the bases it builds as this label.
BASE_RECIPE_LABEL = "aiptrain.base-recipe"
MAPPINGS_FILE = "runtimes.json"  # under AIPTRAIN_HOME: versions mapped to a team's images


# -- versions a team mapped to its own images -----------------------------------------------


def mapped(home: Path) -> dict[str, dict]:
    path = home / MAPPINGS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def lookup(version: str, home: Path, given_as: str = "--runtime-version") -> Runtime:
    return runtime(version, given_as, mapped(home))


def add_mapping(version: str, image: str, home: Path) -> dict:
    """Map `version` to `image` (which must be on the engine); returns the stored entry."""
    validate_runtime_version_name(version)
    validate_image_reference(image)
    if not image_exists(image):
        raise EnvironmentNotReady(
            f"Image [{image}] is not on this Docker engine: pull, load or build it first, then run this again."
        )
    entry = {"image": image, "python": _python_of(image)}
    _write_mappings(home, {**mapped(home), version: entry})
    return entry


def remove_mapping(version: str, home: Path) -> None:
    entries = mapped(home)
    if version not in entries:
        raise ValidationError(f"Runtime version [{version}] is not mapped to an image (`aiptrain runtimes list`).")
    del entries[version]
    _write_mappings(home, entries)


def _write_mappings(home: Path, entries: dict) -> None:
    home.mkdir(parents=True, exist_ok=True)
    partial = home / f".{MAPPINGS_FILE}.partial"
    partial.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    partial.replace(home / MAPPINGS_FILE)


def _python_of(image: str) -> str:
    """major.minor of an image's Python: its aiptrain.python label, else asked."""
    api = connect()
    labels = api.inspect_image(image).get("Config", {}).get("Labels") or {}
    return labels.get("aiptrain.python") or image_python(api, image)[0]


# -- what an image holds --------------------------------------------------------------------------


def image_contents(rt: Runtime, labels: Mapping[str, str] | None) -> Image:
    """What a trainer's requirements resolve against (aiptrain.dependencies): what the image's
    label records it installed. `labels`: the image's, as the submit's inspection found them
    (None: the engine lacks the image, and the backend's own check says what to do)."""
    return held_by(rt, (labels or {}).get(INSTALLED_LABEL, "").split())


def held_by(rt: Runtime, recorded: list[str]) -> Image:
    """The image of `rt` holding the `name==version` releases its label recorded; for an image
    built before it recorded them, the catalog's pins, its unpinned names served whatever
    release a trainer asks for."""
    pins = recorded or [p for p in rt.packages if p not in rt.bounds]
    return Image(rt.version, {canonical_name(n): v or None for n, _, v in (p.partition("==") for p in pins)},
                 rt.bounds)


# -- availability --------------------------------------------------------------------------------


def image_exists(image: str) -> bool:
    return _image_labels(image) is not None


def _image_labels(image: str) -> dict[str, str] | None:
    """The image's labels; None when the engine does not have it."""
    from docker.errors import ImageNotFound

    try:
        return connect().inspect_image(image).get("Config", {}).get("Labels") or {}
    except ImageNotFound:
        return None


COMPAT_MODULE = "aiptrain_compat.py"
COMPAT_PTH = "aiptrain-compat.pth"


def _shipped(name: str) -> str:
    return resources.files("aiptrain.runtime").joinpath(name).read_text()


def recipe(rt: Runtime) -> str:
    """A digest of what the runtime's image is built from."""
    compat = [_shipped(COMPAT_MODULE), rt.compat_line] if rt.compat_line else []
    text = json.dumps([_shipped("runtime.Dockerfile"), list(rt.packages), rt.base.name, rt.python, *compat])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def image_is_current(rt: Runtime) -> bool:
    """The runtime's image is on the engine and was built from this aiptrain's recipe on a current
    base. A mapped image is the team's own: present is current."""
    return is_current(rt, _image_labels(rt.image))


def is_current(rt: Runtime, labels: Mapping[str, str] | None) -> bool:
    """`image_is_current` from the runtime image's labels alone (None: the engine lacks it): a
    built image keeps its base's labels, so the base recipe it was built on is among them, and
    one question about one image answers it. A base pulled or given (no recipe of our script)
    is taken as it is."""
    if labels is None or rt.mapped_image:
        return labels is not None
    if labels.get(RECIPE_LABEL) != recipe(rt):
        return False
    if rt.base.registry_image or BASE_RECIPE_LABEL not in labels:
        return True
    wanted = base_recipe()
    return wanted is None or labels[BASE_RECIPE_LABEL] == wanted


def base_is_current(rt: Runtime) -> bool:
    """The base image is there and, when our script built it, from the script's current recipe.
    A base pulled from a registry or given with AIPTRAIN_BASE_IMAGE is taken as it is."""
    labels = _image_labels(rt.base.image)
    if labels is None or "aiptrain.base" not in labels or rt.base.registry_image:
        return labels is not None
    wanted = base_recipe()
    return wanted is None or labels.get(BASE_RECIPE_LABEL) == wanted


def base_recipe() -> str | None:
    """The base script's recipe number; None where aiptrain runs without its source tree."""
    if not BASE_IMAGE_SCRIPT.is_file():
        return None
    found = re.search(r"^recipe=(\S+)", BASE_IMAGE_SCRIPT.read_text(), re.MULTILINE)
    return found.group(1) if found else None


def unavailable(rt: Runtime, given_as: str = "--runtime-version") -> str:
    """Why a runtime whose base image only a registry serves cannot be built here, and what would serve."""
    which = "runtimeVersion in the config file" if given_as.startswith("runtimeVersion") else "--runtime-version"
    return (
        f"Runtime {rt.version} needs Python {rt.python} from [{rt.base.image}], which this engine does not have "
        f"and cannot pull: use {which} 2.x, a custom container (--master-image-uri), or map an image you have "
        f"with `aiptrain runtimes add {rt.version} --image IMAGE`."
    )


def check_available(rt: Runtime, given_as: str = "--runtime-version", present: bool | None = None) -> None:
    """At submit: a runtime whose image is missing and cannot be built here fails with what would serve.
    A missing image that can be built is left to the backend's check (`aiptrain runtimes build`).
    `present`: whether the engine has the runtime's image, when the caller asked already."""
    if rt.mapped_image or not rt.base.registry_image or present:
        return
    if (present is None and image_exists(rt.image)) or image_exists(rt.base.image):
        return
    raise EnvironmentLacks(unavailable(rt, given_as))


# -- building on demand ------------------------------------------------------------------------------

BASE_IMAGE_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "build-base-image.sh"


def ensure_image(rt: Runtime, cache_dir: Path, progress: Callable[[str], None], given_as: str) -> bool:
    """At submit, as `docker run` pulls: build the runtime's image when the engine lacks it (and
    its base first where this machine can); True when it was built. One build at a time per
    installation; a submit that waited finds the image ready."""
    if rt.mapped_image or image_is_current(rt):
        return False
    check_available(rt, given_as)

    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / "image-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image_is_current(rt):
            return False
        why = "was built by an older aiptrain" if image_exists(rt.image) else "is not on this Docker engine"
        progress(f"Runtime image [{rt.image}] {why}: building it now, once (AIPTRAIN_AUTO_BUILD=0 refuses instead).")
        if not rt.base.registry_image and not base_is_current(rt):
            build_base_image(rt, progress)
        build_image(rt, cache_dir, progress, given_as)
    return True


def build_base_image(rt: Runtime, progress: Callable[[str], None]) -> None:
    """The base image through scripts/build-base-image.sh (debootstrap needs root); elsewhere an
    EnvironmentNotReady that names the command to run."""
    command = f"sudo {BASE_IMAGE_SCRIPT} {rt.base.name}"
    if not BASE_IMAGE_SCRIPT.is_file() or os.getuid() != 0:
        where = command if BASE_IMAGE_SCRIPT.is_file() else f"scripts/build-base-image.sh {rt.base.name} from aiptrain's source"
        raise EnvironmentNotReady(
            f"Base image [{rt.base.image}] of runtime {rt.version} is missing, and building it needs root: run `{where}`, "
            "then submit again."
        )
    progress(f"Building base image [{rt.base.image}] with {BASE_IMAGE_SCRIPT.name} (debootstrap; a few minutes)")
    # The script keeps an image of that name; one from an older recipe is replaced.
    process = subprocess.Popen([str(BASE_IMAGE_SCRIPT), rt.base.name], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None  # stdout=PIPE
    for line in process.stdout:
        if line.strip():
            progress(line.rstrip())
    if process.wait() != 0 or not image_exists(rt.base.image):
        raise EnvironmentNotReady(f"Building base image [{rt.base.image}] failed: run `{command}` to see why.")


# -- building ------------------------------------------------------------------------------------


def image_python(api, image: str) -> tuple[str, str]:
    """(version like '3.11', site-packages dir) of the Python inside an image."""
    script = "import site, sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}', site.getsitepackages()[0])"
    version, site = api_run(api, image, ["python3", "-c", script]).split()
    return version, site


def api_run(api, image: str, command: list[str]) -> str:
    container = api.create_container(image, command=command)
    try:
        api.start(container)
        status = api.wait(container)["StatusCode"]
        output = api.logs(container).decode()
    finally:
        api.remove_container(container, force=True)
    if status != 0:
        raise EnvironmentNotReady(f"Running {command[0]} in [{image}] failed: {output.strip()[-300:]}")
    return output


def download_wheelhouse(packages: tuple[str, ...], python_version: str, arch: str, target: Path) -> None:
    """A fresh wheelhouse (what is in it is what the image installs: its lock), with the requirements."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    (target / "requirements.txt").write_text("".join(f"{p}\n" for p in packages))
    if not packages:
        return
    try:
        # No hint: --packages cannot serve an image build.
        wheelhouse.download(list(packages), python_version, wheelhouse.platform_tags(arch), target, hint="")
    except ValidationError as exc:
        raise EnvironmentNotReady(f"Cannot download the runtime's wheels for Python {python_version}: {exc}") from None


def _ensure_base(api, rt: Runtime, given_as: str, progress: Callable[[str], None]) -> str:
    base = rt.base.image
    if base_is_current(rt):
        return base
    if image_exists(base):
        raise EnvironmentNotReady(
            f"Base image [{base}] was built by an older aiptrain: rebuild it with {rt.base.how_to_get}."
        )
    if not rt.base.registry_image:
        raise EnvironmentNotReady(
            f"Base image [{base}] is missing: build it with {rt.base.how_to_get}"
            + (" or set AIPTRAIN_BASE_IMAGE." if rt.base.name == "bookworm" else ".")
        )
    progress(f"Pulling {base}")
    try:
        api.pull(base)
    except Exception:  # no registry answers here: say what would serve instead
        raise EnvironmentLacks(unavailable(rt, given_as)) from None
    return base


def _write_compat(rt: Runtime, folder: Path) -> None:
    """What goes into the image's site-packages beside the frameworks: aiptrain_compat and the .pth
    line that installs the runtime's surfaces at every Python start (empty where there are none)."""
    folder.mkdir()
    if rt.compat_line:
        (folder / COMPAT_MODULE).write_text(_shipped(COMPAT_MODULE))
        (folder / COMPAT_PTH).write_text(rt.compat_line + "\n")


def build_image(
    rt: Runtime,
    cache_dir: Path,
    progress: Callable[[str], None] = lambda line: None,
    given_as: str = "runtime version",
) -> str:
    """Build (or rebuild) the runtime's image; return its name."""
    if rt.mapped_image:
        raise ValidationError(
            f"Runtime {rt.version} is mapped to [{rt.mapped_image}]: there is nothing to build "
            f"(`aiptrain runtimes remove {rt.version}` drops the mapping)."
        )
    api = connect(timeout=1800)
    base_image = _ensure_base(api, rt, given_as, progress)
    python_version, site = image_python(api, base_image)
    if python_version != rt.python:
        raise EnvironmentNotReady(
            f"Base image [{base_image}] has Python {python_version}, runtime {rt.version} needs {rt.python}: "
            f"build the base with {rt.base.how_to_get}."
        )
    arch = api.info().get("Architecture", "x86_64")
    wheels = cache_dir / "wheelhouse" / f"{rt.version}-py{python_version}-{arch}"
    progress(f"Downloading wheels for Python {python_version} ({arch}) into {wheels}")
    download_wheelhouse(rt.packages, python_version, arch, wheels)

    with tempfile.TemporaryDirectory(prefix="aiptrain-runtime-") as context:
        installed = wheelhouse.lock_of(wheels)
        (Path(context) / "Dockerfile").write_text(_shipped("runtime.Dockerfile"))
        shutil.copytree(wheels, Path(context) / "wheelhouse")
        _write_compat(rt, Path(context) / "compat")
        progress(f"Building {rt.image} from {base_image}")
        stream = api.build(
            path=context,
            tag=rt.image,
            buildargs={
                "BASE_IMAGE": base_image, "PYTHON_SITE": site, "RUNTIME_VERSION": rt.version,
                "BASE_NAME": rt.base.name, "PYTHON_VERSION": python_version, "IMPORTS": ", ".join(rt.imports),
                "COMPAT": " ".join(surface.name for surface in rt.compat),
            },
            labels={INSTALLED_LABEL: " ".join(installed), RECIPE_LABEL: recipe(rt)},
            rm=True,
            forcerm=True,
            decode=True,
        )
        follow_build(stream, rt.image, progress)
    # The legacy builder keeps the install stage as an untagged image holding the wheelhouse.
    api.prune_images(filters={"label": "aiptrain.build-stage=install", "dangling": True})
    return rt.image


def follow_build(stream: Iterable[dict], image: str, progress: Callable[[str], None]) -> None:
    """Follow the engine's build of `image` (a decoded build stream): each output line to
    `progress`; the engine's error raised as EnvironmentNotReady (exit 3) naming the image."""
    for chunk in stream:
        if "error" in chunk:
            raise EnvironmentNotReady(f"Building {image} failed: {chunk['error'].strip()}")
        line = chunk.get("stream", "").strip()
        if line:
            progress(line)

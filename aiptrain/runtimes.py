"""Runtime versions: `--runtime-version` names a local image that aiptrain builds itself.

AI Platform's runtime versions ran Python 3.7 with the TensorFlow of the same number.
Our images run the base image's Python (3.11 on Debian bookworm), so each runtime
version pins the nearest framework releases that have wheels for it: TensorFlow 2.12
is the oldest release built for Python 3.11, so the 2.x runtimes get 2.12.1.

Images are built offline: the host downloads a wheelhouse for the engine's platform
(`pip download`), and the Dockerfile shipped with aiptrain installs from it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

from aiptrain.errors import EnvironmentNotReady, ValidationError

IMAGE_REPOSITORY = "aiptrain/runtime"


@dataclass(frozen=True)
class Runtime:
    version: str
    packages: tuple[str, ...]  # pip requirement strings installed into the image
    description: str

    @property
    def image(self) -> str:
        return f"{IMAGE_REPOSITORY}:{self.version}"

    @property
    def provides(self) -> frozenset[str]:
        """Distributions preinstalled in the image (canonical names): a trainer's requirement
        of one of them is served by the image, as on AI Platform, not installed again."""
        names = {re.split(r"[<>=!~\[; ]", p, maxsplit=1)[0].lower().replace("_", "-") for p in self.packages}
        return frozenset(names | {alias for name in names for alias in _PROVIDES_ALSO.get(name, ())})


# `tensorflow-cpu` installs the same `tensorflow` module: a trainer asking for `tensorflow`
# runs on the image's build instead of pulling the 500 MB GPU build into every job.
_PROVIDES_ALSO = {"tensorflow-cpu": ("tensorflow",)}
_TF2 = ("tensorflow-cpu==2.12.1", "scikit-learn==1.2.2", "pandas==1.5.3")
RUNTIMES = {
    r.version: r
    for r in (
        Runtime("2.11", _TF2, "TensorFlow 2.12.1 (nearest to 2.11 for Python 3.11), scikit-learn, pandas"),
        Runtime("2.8", _TF2, "same frameworks as 2.11 (no older TensorFlow runs on Python 3.11)"),
        Runtime("2.5", _TF2, "same frameworks as 2.11 (no older TensorFlow runs on Python 3.11)"),
        Runtime("2.1", _TF2, "same frameworks as 2.11 (no older TensorFlow runs on Python 3.11)"),
        Runtime("minimal", (), "Python and pip only: fast to build, for trainers without frameworks"),
    )
}


def runtime(version: str, given_as: str = "--runtime-version") -> Runtime:
    try:
        return RUNTIMES[version]
    except KeyError:
        known = ", ".join(RUNTIMES)
        raise ValidationError(
            f"Unknown {given_as} [{version}]: choose one of {known} (`aiptrain runtimes list`)."
        ) from None


def image_exists(image: str) -> bool:
    from docker.errors import ImageNotFound

    from aiptrain.backends.docker import connect

    try:
        connect().inspect_image(image)
    except ImageNotFound:
        return False
    return True


# pip's platform tags for the engine's architecture; tensorflow-cpu's wheels are manylinux_2_27 only.
PLATFORM_TAGS = {
    "x86_64": ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64"),
    "aarch64": ("manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_27_aarch64", "manylinux_2_28_aarch64"),
}


def image_python(api, base_image: str) -> tuple[str, str]:
    """(version like '3.11', site dir) of the Python inside the base image."""
    script = "import sys, sysconfig; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"
    output = api_run(api, base_image, ["python3", "-c", script])
    version = output.strip()
    return version, f"/usr/local/lib/python{version}/dist-packages"


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
    target.mkdir(parents=True, exist_ok=True)
    (target / "requirements.txt").write_text("".join(f"{p}\n" for p in packages))
    if not packages:
        return
    platforms = [arg for tag in PLATFORM_TAGS.get(arch, PLATFORM_TAGS["x86_64"]) for arg in ("--platform", tag)]
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--only-binary=:all:", "--implementation", "cp", "--python-version", python_version,
        *platforms, "--dest", str(target), *packages,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["pip download failed"])[-1]
        raise EnvironmentNotReady(f"Cannot download the runtime's wheels for Python {python_version}: {last}")


def build_image(
    rt: Runtime,
    base_image: str,
    cache_dir: Path,
    progress: Callable[[str], None] = lambda line: None,
) -> str:
    """Build (or rebuild) the runtime's image; return its name."""
    from aiptrain.backends.docker import connect

    api = connect(timeout=1800)
    if not image_exists(base_image):
        raise EnvironmentNotReady(
            f"Base image [{base_image}] is missing: build it with `scripts/build-base-image.sh` "
            "(debootstrap, no registry needed) or set AIPTRAIN_BASE_IMAGE."
        ) from None

    python_version, site = image_python(api, base_image)
    arch = api.info().get("Architecture", "x86_64")
    wheelhouse = cache_dir / "wheelhouse" / f"{rt.version}-py{python_version}-{arch}"
    progress(f"Downloading wheels for Python {python_version} ({arch}) into {wheelhouse}")
    download_wheelhouse(rt.packages, python_version, arch, wheelhouse)

    with tempfile.TemporaryDirectory(prefix="aiptrain-runtime-") as context:
        dockerfile = resources.files("aiptrain.runtime").joinpath("runtime.Dockerfile").read_text()
        (Path(context) / "Dockerfile").write_text(dockerfile)
        shutil.copytree(wheelhouse, Path(context) / "wheelhouse")
        progress(f"Building {rt.image} from {base_image}")
        stream = api.build(
            path=context,
            tag=rt.image,
            buildargs={"BASE_IMAGE": base_image, "PYTHON_SITE": site, "RUNTIME_VERSION": rt.version},
            rm=True,
            forcerm=True,
            decode=True,
        )
        for chunk in stream:
            if "error" in chunk:
                raise EnvironmentNotReady(f"Building {rt.image} failed: {chunk['error'].strip()}")
            line = chunk.get("stream", "").strip()
            if line:
                progress(line)
    # The legacy builder keeps the install stage as an untagged image holding the wheelhouse.
    api.prune_images(filters={"label": "aiptrain.build-stage=install", "dangling": True})
    return rt.image

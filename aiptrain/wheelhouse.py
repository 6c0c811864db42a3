"""Hermetic replicas: the packages' dependencies (a trainer's `install_requires`),
resolved once on this host, against what the runtime image holds (aiptrain/dependencies.py),
into a wheelhouse of what the image lacks, which the replicas install with
`pip install --no-index --no-deps`. Replicas never reach a package index: they have no route
to one here, and a job must not depend on what an index serves the moment each replica starts.
The runtime images' own wheelhouses are resolved here too (aiptrain/runtimes.py).

Wheels only (`--only-binary=:all:`), for the replicas' Python (the runtime's) and platform
rather than this host's, so nothing is ever compiled inside a replica. A project that
publishes only an sdist (cloudml-hypertune, wrapt 1.12.1) gets its wheel built here when it
builds as pure Python; one that needs compiling is refused. Wheelhouses are cached by
what they were resolved for (the requirements, constraints, Python version and platform tags), so
resubmitting a job resolves nothing; a cached wheelhouse keeps the versions it was
resolved with, which is what makes reruns reproducible.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from aiptrain import dependencies
from aiptrain.cache import touch
from aiptrain.dependencies import Image, Resolution, canonical_name
from aiptrain.errors import EnvironmentNotReady, ValidationError

log = logging.getLogger(__name__)

# The replicas' Python comes from the runtime (aiptrain/runtime_catalog.py); custom
# containers install nothing, so they need no wheelhouse.
CACHE_FORMAT = "3"  # 3: resolved within the image, less what it holds
# pip's platform tags per architecture: tensorflow-cpu 2.5-2.10 ship manylinux2010 wheels,
# later ones manylinux_2_27 only, xgboost 0.90 manylinux1.
PLATFORM_TAGS = {
    arch: tuple(f"{tag}_{arch}" for tag in ("manylinux1", "manylinux2010", "manylinux2014", "manylinux_2_17",
                                            "manylinux_2_27", "manylinux_2_28"))
    for arch in ("x86_64", "aarch64")
}
_NO_DISTRIBUTION = re.compile(r"No matching distribution found for (\S+)")
_NAME = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")


def requirement_name(requirement: str) -> str | None:
    match = _NAME.match(requirement)
    return canonical_name(match.group(1)) if match else None


# -- reading a package's metadata ------------------------------------------------------------


def _parse_metadata(text: str) -> tuple[str, list[str]]:
    message = email.parser.Parser().parsestr(text, headersonly=True)
    return message.get("Name", ""), [r.strip() for r in message.get_all("Requires-Dist") or []]


def parse_requires_txt(text: str) -> list[str]:
    """setuptools' egg-info/requires.txt: unconditional lines, then `[extra:marker]` sections.
    Only sections without an extra apply to a plain install."""
    requirements, marker, active = [], "", True
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            extra, _, marker = line[1:-1].partition(":")
            active = not extra.strip()
            continue
        if active:
            requirements.append(f"{line}; {marker}" if marker else line)
    return requirements


def _sdist_members(path: Path) -> dict[str, bytes]:
    """PKG-INFO and egg-info/requires.txt of an sdist's top directory, by their path below it."""
    def below_top(name: str) -> str | None:
        parts = name.split("/")
        wanted = parts[1:] == ["PKG-INFO"] or (len(parts) == 3 and parts[2] == "requires.txt")
        return "/".join(parts[1:]) if wanted else None

    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            return {below: archive.read(n) for n in archive.namelist() if (below := below_top(n))}
    members = {}
    with tarfile.open(path) as tar:
        for member in tar:
            below = below_top(member.name)
            content = tar.extractfile(member) if below and member.isfile() else None
            if below and content is not None:
                members[below] = content.read()
    return members


def read_metadata(path: Path) -> tuple[str, list[str]]:
    """(project name, requirement strings) of a wheel or an sdist."""
    try:
        if path.name.endswith(".whl"):
            with zipfile.ZipFile(path) as archive:
                name = next(n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
                return _parse_metadata(archive.read(name).decode("utf-8", "replace"))
        members = _sdist_members(path)
        name, requirements = _parse_metadata(members.get("PKG-INFO", b"").decode("utf-8", "replace"))
        if not requirements:  # setuptools before 68 keeps them out of the sdist's PKG-INFO
            requires = next((v for k, v in members.items() if k.endswith(".egg-info/requires.txt")), b"")
            requirements = parse_requires_txt(requires.decode("utf-8", "replace"))
        return name, requirements
    except (OSError, tarfile.TarError, zipfile.BadZipFile, StopIteration, KeyError):
        raise ValidationError(
            f"Cannot read the package metadata of [{path.name}]: pass an sdist (.tar.gz) or a wheel (.whl)."
        ) from None


def requirements_for(packages: list[Path], preinstalled: frozenset[str] = frozenset()) -> list[str]:
    """What `packages` need from an index: their requirements, less what they provide themselves
    and the names in `preinstalled`."""
    provided, needed = set(preinstalled), []
    for path in packages:
        name, requirements = read_metadata(path)
        provided.add(canonical_name(name or path.name.split("-")[0]))
        needed += [r for r in requirements if r not in needed]
    return [r for r in needed if requirement_name(r) not in provided]


def lock_of(wheels: Path) -> list[str]:
    """`name==version` of every wheel in a directory, sorted: a wheelhouse's lock."""
    return sorted({"==".join(_name_and_version(wheel)) for wheel in wheels.glob("*.whl")})


def _name_and_version(wheel: Path) -> tuple[str, str]:
    """(canonical name, version) from a wheel's file name (PEP 427: NAME-VERSION-...)."""
    name, version = wheel.name.split("-")[:2]
    return canonical_name(name), version


# -- resolving ---------------------------------------------------------------------------------


def platform_tags(machine: str | None = None) -> tuple[str, ...]:
    """pip's platform tags for the replicas: the engine runs on this host (it bind-mounts
    host paths), so it has this host's architecture. The same tags the runtime images'
    own wheels were downloaded for."""
    machine = (machine or platform.machine()).lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return PLATFORM_TAGS.get(machine, PLATFORM_TAGS["x86_64"])


def resolve(packages: list[Path], cache_dir: Path, python_version: str, image: Image | None = None) -> list[Path]:
    """The wheels `packages` need installed beside them in a replica of `image` (the rules of
    aiptrain/dependencies.py): only what the image does not already hold; [] when none."""
    return resolve_requirements(requirements_for(packages), cache_dir, python_version, image)


def resolve_requirements(requirements: list[str], cache_dir: Path, python_version: str,
                         image: Image | None = None) -> list[Path]:
    """The wheels that `requirements` (and their dependencies) add to `image`, from the cache
    when they were resolved before for the same Python and platform; [] when the image holds
    them all."""
    image = image or Image("custom")
    resolution = dependencies.plan(requirements, image, python_version)
    if not resolution.requirements:
        return []
    platforms = platform_tags()
    key = hashlib.sha256(json.dumps([
        CACHE_FORMAT, sorted(resolution.requirements), sorted(resolution.constraints), python_version, platforms,
    ]).encode()).hexdigest()
    entry = cache_dir / "wheelhouses" / key
    if (entry / "requirements.txt").is_file():
        log.debug("Reusing the cached wheelhouse %s for %s.", key[:12], ", ".join(resolution.requirements))
        touch(entry)  # its last use, for cache pruning
        return sorted(entry.glob("*.whl"))
    log.debug("Resolving %s for Python %s (%s) into a wheelhouse.", ", ".join(resolution.requirements),
              python_version, platforms[0])
    entry.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=entry.parent))
    try:
        _download_within(resolution, image, python_version, platforms, partial)
        resolved = {wheel: _name_and_version(wheel) for wheel in partial.glob("*.whl")}
        needed = dependencies.to_install(dict(resolved.values()), image)
        for wheel, (name, version) in resolved.items():
            if needed.get(name) != version:  # the image holds that very release already
                wheel.unlink()
        # Written last: an entry with requirements.txt is complete.
        (partial / "requirements.txt").write_text("".join(f"{r}\n" for r in resolution.requirements))
        shutil.rmtree(entry, ignore_errors=True)  # an incomplete entry left by a killed submit
        try:
            os.rename(partial, entry)
        except OSError:
            if not (entry / "requirements.txt").is_file():
                raise
            log.debug("Another submit cached the same wheelhouse first; using it.")
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    wheels = sorted(entry.glob("*.whl"))
    log.debug("Wheelhouse %s: %s", key[:12], ", ".join(w.name for w in wheels))
    return wheels


def _download_within(resolution: Resolution, image: Image, python_version: str, platforms: tuple[str, ...],
                     destination: Path) -> None:
    """`download` within the resolution's constraints, letting go of the held releases that what
    the trainer pinned contradicts (dependencies.release); a real conflict is one line."""
    while True:
        try:
            download(list(resolution.requirements), python_version, platforms, destination,
                     list(resolution.constraints))
            return
        except ResolutionFailed as failed:
            conflict = dependencies.parse_conflict(failed.output)
            if conflict is None or not conflict.constrained:
                raise
            released = dependencies.release(resolution, conflict)
            if released is None:
                raise ValidationError(dependencies.conflict_message(conflict, image)) from None
            log.debug("Letting go of the image's %s for the trainer's pins.",
                      ", ".join(sorted(released.pinned - resolution.pinned)))
            resolution = released


# What to suggest when a dependency has no wheel: a trainer can pass one with --packages; an
# image build cannot (the builder itself must make the wheel), so it says nothing further.
TRAINER_HINT = "Require a version that has such a wheel, or pass the wheel with --packages."
# Projects whose sdist builds a C extension only as an option: built here without it, they are
# pure Python wheels that fit any replica (TensorFlow 2.5-2.6 pin wrapt~=1.12.1, sdist only).
PURE_BUILD_ENV = {"wrapt": {"WRAPT_INSTALL_EXTENSIONS": "false"}}


def download(
    requirements: list[str],
    python_version: str,
    platforms: tuple[str, ...],
    destination: Path,
    constraints: Sequence[str] = (),
    hint: str = TRAINER_HINT,
) -> None:
    """Wheels for `requirements` and their dependencies into `destination`, within `constraints`.
    Where pip finds no wheel for a project that has an sdist, its wheel is built here (pure
    Python only) and the resolution runs again with it."""
    built = destination / ".built-from-sdists"

    def attempt(wanted: list[str]) -> str | list[str] | None:
        output = _pip(["download", "--dest", str(destination)], wanted, python_version, platforms, built, constraints)
        if output is None:
            return _missed_by_markers(_wheel_metadata(destination), python_version)
        return output

    _with_wheels_built_from_sdists(attempt, requirements, built, python_version, platforms, hint)
    shutil.rmtree(built, ignore_errors=True)


def resolve_versions(
    requirements: list[str],
    python_version: str,
    platforms: tuple[str, ...],
    constraints: Sequence[str] = (),
    hint: str = TRAINER_HINT,
) -> dict[str, str]:
    """What `download` would fetch, as {canonical name: version}, downloading nothing but the
    metadata (pip's --dry-run --report) and the sdists that need a wheel built."""
    with tempfile.TemporaryDirectory(prefix="aiptrain-resolve-") as scratch:
        built, report = Path(scratch) / "built", Path(scratch) / "report.json"
        installs: list[dict] = []

        def attempt(wanted: list[str]) -> str | list[str] | None:
            output = _pip(
                ["install", "--dry-run", "--ignore-installed", "--target", str(Path(scratch) / "target"),
                 "--report", str(report)], wanted, python_version, platforms, built, constraints,
            )
            if output is not None:
                return output
            installs[:] = json.loads(report.read_text())["install"]
            metadata = [(i["metadata"]["name"], i["metadata"].get("requires_dist") or []) for i in installs]
            return _missed_by_markers(metadata, python_version)

        _with_wheels_built_from_sdists(attempt, requirements, built, python_version, platforms, hint)
        return {canonical_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


def _with_wheels_built_from_sdists(
    attempt: Callable[[list[str]], str | list[str] | None], requirements: list[str], built: Path,
    python_version: str, platforms: tuple[str, ...], hint: str,
) -> None:
    """Run `attempt(requirements)` until it succeeds: it returns None when done, pip's output
    when pip failed, or requirements pip skipped (markers) to add and try again."""
    tried: set[str] = set()
    while True:
        outcome = attempt(requirements)
        if outcome is None:
            return
        if isinstance(outcome, list):
            log.debug("pip skipped %s (markers for Python %s): adding them.", ", ".join(outcome), python_version)
            requirements = [*requirements, *outcome]
            continue
        missing = _NO_DISTRIBUTION.search(outcome)
        name = requirement_name(missing.group(1)) if missing else None
        if missing is None or not name or name in tried:
            raise _resolution_error(outcome, python_version, platforms, hint)
        tried.add(name)
        log.debug("No wheel for %s: building one from its sdist.", missing.group(1))
        if build_pure_wheel(missing.group(1), built, hint) is None:  # no sdist either
            raise _resolution_error(outcome, python_version, platforms, hint)


def _missed_by_markers(metadata: list[tuple[str, list[str]]], python_version: str) -> list[str] | None:
    missed = requirements_missed_by_markers(metadata, python_version)
    return missed or None


def _wheel_metadata(wheels: Path) -> list[tuple[str, list[str]]]:
    return [read_metadata(wheel) for wheel in wheels.glob("*.whl")]


def marker_requirements_missed(wheels: Path, python_version: str) -> list[str]:
    """`requirements_missed_by_markers` of the wheels in a directory."""
    return requirements_missed_by_markers(_wheel_metadata(wheels), python_version)


def requirements_missed_by_markers(metadata: list[tuple[str, list[str]]], python_version: str) -> list[str]:
    """Requirements of the resolved projects ((name, requirements) each) that apply on the
    replicas' Python but are not there: pip evaluates markers (`importlib-metadata;
    python_version < "3.10"`) for the host's Python even with --python-version."""
    from packaging.requirements import Requirement

    environment = dependencies.replica_environment(python_version)
    present, missed = set(), []
    for name, requires in metadata:
        present.add(canonical_name(name))
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker and "extra" not in str(requirement.marker) and requirement.marker.evaluate(environment):
                missed.append(str(requirement).split(";")[0].strip())
    return sorted({r for r in missed if requirement_name(r) not in present})


def build_pure_wheel(requirement: str, destination: Path, hint: str = TRAINER_HINT) -> Path | None:
    """Build `requirement`'s wheel from its sdist on this host (no deps); None when it has no sdist.
    One that needs compiling is refused: a wheel built here would not fit the replicas."""
    destination.mkdir(parents=True, exist_ok=True)
    name = requirement_name(requirement) or requirement
    with tempfile.TemporaryDirectory(prefix="aiptrain-sdist-") as scratch:
        command = [
            # --no-cache-dir: pip's wheel cache keys a built wheel by its sdist, not by the
            # environment it was built in (a wrapt built with its extension would come back).
            sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "--no-input",
            "--no-cache-dir", "--progress-bar", "off", "--no-binary", name, "--wheel-dir", scratch, requirement,
        ]
        result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **PURE_BUILD_ENV.get(name, {})})
        wheels = list(Path(scratch).glob("*.whl"))
        output = result.stdout + result.stderr
        if result.returncode != 0 and _NO_DISTRIBUTION.search(output):
            return None
        if result.returncode != 0 or not wheels:
            raise ValidationError(
                f"[{name}] publishes no wheel for the replicas and building one from its sdist failed "
                f"({_last_error(output)}).{_then(hint)}"
            )
        wheel = wheels[0]
        if not wheel.name.endswith("-none-any.whl"):
            raise ValidationError(
                f"[{name}] publishes no wheel for the replicas and its sdist needs compiling ({wheel.name}).{_then(hint)}"
            )
        return Path(shutil.move(str(wheel), destination / wheel.name))


# pip with the replicas' Python in its markers: pip evaluates `; python_version < "3.11"` for
# the Python it runs on even with --python-version, and so resolved aiohttp's multidict 6.7 (it
# needs typing-extensions>=4.1 on Python 3.9) beside TensorFlow 2.5's typing-extensions~=3.7.4.
_PIP_FOR_REPLICAS = """
import sys
from pip._vendor.packaging import markers
from pip._internal.cli.main import main
host = markers.default_environment
version = sys.argv.pop(1)
markers.default_environment = lambda: {**host(), "python_version": version, "python_full_version": version + ".0"}
sys.exit(main(sys.argv[1:]))
"""


def _pip(
    command: list[str], requirements: list[str], python_version: str, platforms: tuple[str, ...], built: Path,
    constraints: Sequence[str] = (),
) -> str | None:
    """pip's output when `pip COMMAND` failed for the replicas' Python and platform, None when it succeeded."""
    built.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", prefix="aiptrain-constraints-", suffix=".txt") as constraint_file:
        constraint_file.write("".join(f"{c}\n" for c in constraints))
        constraint_file.flush()
        result = subprocess.run([
            sys.executable, "-c", _PIP_FOR_REPLICAS, python_version, *command, "--disable-pip-version-check", "--no-input",
            "--progress-bar", "off", "--only-binary=:all:", "--implementation", "cp",
            "--python-version", python_version, *[arg for tag in platforms for arg in ("--platform", tag)],
            "--find-links", str(built), *(["-c", constraint_file.name] if constraints else []), *requirements,
        ], capture_output=True, text=True)
    return None if result.returncode == 0 else result.stdout + result.stderr


class ResolutionFailed(ValidationError):
    """pip could not resolve the requirements; `output` is what it said."""

    def __init__(self, message: str, output: str):
        super().__init__(message)
        self.output = output

    def __reduce__(self):  # pickled whole (from a process pool's worker), not as Exception(message)
        return type(self), (str(self), self.output)


def _resolution_error(output: str, python_version: str, platforms: tuple[str, ...], hint: str) -> Exception:
    if "No module named pip" in output:
        return EnvironmentNotReady(
            f"pip is not installed for {sys.executable}: install it to resolve the packages' dependencies."
        )
    return ResolutionFailed(
        f"Cannot resolve the packages' dependencies for the replicas (Python {python_version}, {platforms[0]}, "
        f"wheels only): {_last_error(output)}.{_then(hint)}", output,
    )


def _then(hint: str) -> str:
    return f" {hint}" if hint else ""


def _last_error(output: str) -> str:
    errors = [line[len("ERROR:") :].strip() for line in output.splitlines() if line.startswith("ERROR:")]
    return (errors or output.strip().splitlines() or ["pip failed"])[-1].rstrip(".")

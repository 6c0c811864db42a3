"""Hermetic replicas: the packages' dependencies (a trainer's `install_requires`),
resolved once on this host into a wheelhouse the replicas install from with
`pip install --no-index --find-links`. Replicas never reach a package index: they
have no route to one here, and a job must not depend on what an index serves the
moment each replica starts.

Wheels only (`--only-binary=:all:`), for the replicas' Python and platform rather than
this host's, so nothing is ever compiled inside a replica. Wheelhouses are cached by
what they were resolved for (the requirements, Python version and platform tags), so
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
from pathlib import Path

from aiptrain.cache import touch
from aiptrain.errors import EnvironmentNotReady, ValidationError

log = logging.getLogger(__name__)

# The Python of every runtime image (Debian bookworm's 3.11, see aiptrain/runtimes.py).
# Custom containers install nothing, so they need no wheelhouse.
REPLICA_PYTHON = "3.11"
CACHE_FORMAT = "1"
_NAME = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")


def canonical_name(name: str) -> str:
    """PEP 503: `Foo_Bar.baz` and `foo-bar-baz` are the same project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str | None:
    match = _NAME.match(requirement)
    return canonical_name(match.group(1)) if match else None


# -- reading a package's metadata ------------------------------------------------------------


def _parse_metadata(text: str) -> tuple[str, list[str]]:
    message = email.parser.Parser().parsestr(text, headersonly=True)
    return message.get("Name", ""), [r.strip() for r in message.get_all("Requires-Dist") or []]


def _parse_requires_txt(text: str) -> list[str]:
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
            return {below_top(n): archive.read(n) for n in archive.namelist() if below_top(n)}
    with tarfile.open(path) as archive:
        return {
            below_top(m.name): archive.extractfile(m).read() for m in archive if m.isfile() and below_top(m.name)
        }


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
            requirements = _parse_requires_txt(requires.decode("utf-8", "replace"))
        return name, requirements
    except (OSError, tarfile.TarError, zipfile.BadZipFile, StopIteration, KeyError):
        raise ValidationError(
            f"Cannot read the package metadata of [{path.name}]: pass an sdist (.tar.gz) or a wheel (.whl)."
        ) from None


def requirements_for(packages: list[Path], preinstalled: frozenset[str] = frozenset()) -> list[str]:
    """What `packages` need from an index: their requirements, less what they provide themselves
    and what the runtime image has preinstalled."""
    provided, needed = set(preinstalled), []
    for path in packages:
        name, requirements = read_metadata(path)
        provided.add(canonical_name(name or path.name.split("-")[0]))
        needed += [r for r in requirements if r not in needed]
    return [r for r in needed if requirement_name(r) not in provided]


# -- resolving ---------------------------------------------------------------------------------


def platform_tags(machine: str | None = None) -> tuple[str, ...]:
    """pip's platform tags for the replicas: the engine runs on this host (it bind-mounts
    host paths), so it has this host's architecture. The same tags the runtime images'
    own wheels were downloaded for."""
    from aiptrain.runtimes import PLATFORM_TAGS

    machine = (machine or platform.machine()).lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return PLATFORM_TAGS.get(machine, PLATFORM_TAGS["x86_64"])


def resolve(
    packages: list[Path],
    cache_dir: Path,
    python_version: str = REPLICA_PYTHON,
    preinstalled: frozenset[str] = frozenset(),
) -> list[Path]:
    """The wheels `packages` need installed beside them in a replica; [] when they need none."""
    requirements = requirements_for(packages, preinstalled)
    if not requirements:
        return []
    platforms = platform_tags()
    key = hashlib.sha256(
        json.dumps([CACHE_FORMAT, sorted(requirements), python_version, platforms]).encode()
    ).hexdigest()
    entry = cache_dir / "wheelhouses" / key
    if (entry / "requirements.txt").is_file():
        log.debug("Reusing the cached wheelhouse %s for %s.", key[:12], ", ".join(requirements))
        touch(entry)  # its last use, for cache pruning
        return sorted(entry.glob("*.whl"))
    log.debug("Resolving %s for Python %s (%s) into a wheelhouse.", ", ".join(requirements), python_version,
              platforms[0])
    entry.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=entry.parent))
    try:
        _download(requirements, python_version, platforms, partial)
        # Written last: an entry with requirements.txt is complete.
        (partial / "requirements.txt").write_text("".join(f"{r}\n" for r in requirements))
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


def _download(requirements: list[str], python_version: str, platforms: tuple[str, ...], destination: Path) -> None:
    command = [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input",
        "--progress-bar", "off", "--only-binary=:all:", "--implementation", "cp",
        "--python-version", python_version, *[arg for tag in platforms for arg in ("--platform", tag)],
        "--dest", str(destination), *requirements,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode == 0:
        return
    output = result.stdout + result.stderr
    if "No module named pip" in output:
        raise EnvironmentNotReady(
            f"pip is not installed for {sys.executable}: install it to resolve the packages' dependencies."
        )
    errors = [line[len("ERROR:") :].strip() for line in output.splitlines() if line.startswith("ERROR:")]
    detail = (errors or output.strip().splitlines() or ["pip download failed"])[-1].rstrip(".")
    raise ValidationError(
        f"Cannot resolve the packages' dependencies for the replicas (Python {python_version}, {platforms[0]}, "
        f"wheels only): {detail}. Require a version that has such a wheel, or pass the wheel with --packages."
    )

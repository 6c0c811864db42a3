"""Install once, not per replica: a job's packages (and their wheelhouse) are installed by one
short container of the runtime image into a content-addressed directory of this host's cache,
keyed by the image's ID and the packages' digests. Every replica mounts it read-only as its
user base (`PYTHONUSERBASE`) and starts the trainer at once; a resubmit of the same trainer on
the same image installs nothing. Packages with compiled parts still build in the runtime
image's own Python, as they would in a replica.

A trainer with no setup.py of its own (aiptrain generates the minimal one, as gcloud does),
nothing else to install and a pure wheel (`py3-none-any`, no scripts, data files or entry
points) is unpacked on this host instead, into the layout pip's `--user` scheme gives it in the
image: that build runs only aiptrain's own setup.py, whose wheel is the same whichever Python
builds it, and the install container, most of a first submit's start, is skipped. Anything
else, a trainer's own setup.py first of all (it may do anything, and the service runs it in the
image), installs in the container. What the host cannot give is bytecode for the image's
Python: replicas compile the trainer's modules as they import them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from aiptrain.backends import Backend
from aiptrain.errors import ValidationError
from aiptrain.planning import install_container
from aiptrain.staging import sha256_of
from aiptrain.storage.local import give_to_replicas

COMPLETE = ".aiptrain-complete"  # written last: a directory without it is an interrupted install


def install_key(image_id: str, package_dir: Path, package_files: list[str], wheelhouse: str | None) -> str:
    """What an install depends on: the image, and the bytes of every package and wheel."""
    digest = hashlib.sha256(image_id.encode())
    for name in package_files:
        digest.update(f"\0{name}\0{sha256_of(package_dir / name)}".encode())
    if wheelhouse:
        for wheel in sorted((package_dir / wheelhouse).iterdir()):
            digest.update(f"\0{wheel.name}\0{sha256_of(wheel)}".encode())
    return digest.hexdigest()


def install_target(cache_dir: Path, image_id: str, package_dir: Path, package_files: list[str],
                   wheelhouse: str | None) -> Path:
    """Where these packages are (or will be) installed for this image: known before the install,
    so a submit plans once, checks the plan, then installs."""
    return cache_dir / "installs" / install_key(image_id, package_dir, package_files, wheelhouse)


def ensure_installed(
    backend: Backend,
    image: str,
    image_id: str,
    package_dir: Path,
    package_files: list[str],
    wheelhouse: str | None,
    cache_dir: Path,
    user: str,
    labels: dict[str, str],
    pure: PureTrainer | None = None,
) -> tuple[Path, bool]:
    """(the installed user base for these packages on this image, whether it was installed now).
    `image_id`: the image's content ID, as the submit's one inspection of it found it.
    A failed install is the package's fault: one line, exit 2, nothing left behind. The install
    container carries the job's labels, so a submit killed meanwhile is cleaned up with its job.
    `pure`: the trainer's wheel, when its sdist is the only package and no wheelhouse is needed."""
    target = install_target(cache_dir, image_id, package_dir, package_files, wheelhouse)
    installs = target.parent
    if (target / COMPLETE).is_file():
        os.utime(target)  # recently used: what the cache pruning goes by
        return target, False
    installs.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=installs, prefix=".installing-"))
    try:
        if os.getuid() == 0:  # the install container runs as the replicas' user
            uid, gid = (int(part) for part in user.split(":"))
            os.chown(scratch, uid, gid)
        if pure is not None and wheelhouse is None and unpacks_on_host(pure.wheel):
            _unpack(pure, scratch, image)
            give_to_replicas(scratch, scratch, whole_tree=True)  # as the container would have left it
        else:
            spec = install_container(image, str(package_dir), tuple(package_files), wheelhouse, str(scratch), user,
                                     labels)
            status, output = backend.run_to_completion(spec)
            if status != 0:
                last = (output.strip().splitlines() or [f"exit status {status}"])[-1]
                raise _install_failed(image, last)
        (scratch / COMPLETE).write_text(image + "\n")
        try:
            scratch.rename(target)
        except OSError:  # a concurrent submit installed the same packages first: use theirs
            shutil.rmtree(scratch, ignore_errors=True)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return target, True


@dataclass(frozen=True)
class PureTrainer:
    wheel: Path  # built beside the trainer's sdist (aiptrain.packaging)
    python: str  # the runtime image's Python, major.minor


def unpacks_on_host(wheel: Path) -> bool:
    """A wheel whose files land the same for any Python 3 and need nothing run: pure
    (`py3-none-any`), no `.data` directory (scripts, headers, data files) and no entry points."""
    from packaging.utils import parse_wheel_filename

    try:
        tags = parse_wheel_filename(wheel.name)[3]
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
    except Exception:  # noqa: BLE001 - anything unexpected: the container installs it, as before
        return False
    pure = all(tag.interpreter.startswith("py3") and tag.abi == "none" and tag.platform == "any" for tag in tags)
    runs_something = any(name.split("/", 1)[0].endswith(".data") or name.endswith(".dist-info/entry_points.txt")
                         for name in names)
    return pure and not runs_something


def _unpack(pure: PureTrainer, target: Path, image: str) -> None:
    """The wheel into `target` laid out as pip's user scheme in the image lays it out (what
    PYTHONUSERBASE points the replicas at). Its Requires-Python is checked as pip would."""
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    with WheelFile.open(pure.wheel) as source:
        metadata = HeaderParser().parsestr(source.read_dist_info("METADATA"))
        requires = metadata.get("Requires-Python")
        try:
            if requires and not SpecifierSet(requires).contains(pure.python, prereleases=True):
                raise _install_failed(image, f"ERROR: Package '{metadata.get('Name')}' requires a different Python: "
                                             f"{pure.python} not in '{requires}'")
        except InvalidSpecifier:
            pass  # pip ignores a malformed one too
        site = str(target / "lib" / f"python{pure.python}" / "site-packages")
        scheme = {"purelib": site, "platlib": site, "scripts": str(target / "bin"), "data": str(target),
                  "headers": str(target / "include" / f"python{pure.python}")}
        install(source, SchemeDictionaryDestination(scheme, interpreter="/usr/bin/python3", script_kind="posix"),
                {"INSTALLER": b"aiptrain\n"})


def _install_failed(image: str, last: str) -> ValidationError:
    return ValidationError(
        f"Installing the job's packages in [{image}] failed: {last} Fix the package (its setup.py "
        "or install_requires) and submit again."
    )

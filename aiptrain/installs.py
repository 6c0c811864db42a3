"""Install once, not per replica: a job's packages (and their wheelhouse) are installed by one
short container of the runtime image into a content-addressed directory of this host's cache,
keyed by the image's ID and the packages' digests. Every replica mounts it read-only as its
user base (`PYTHONUSERBASE`) and starts the trainer at once; a resubmit of the same trainer on
the same image installs nothing. Packages with compiled parts still build in the runtime
image's own Python, as they would in a replica.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from aiptrain.backends import Backend
from aiptrain.errors import ValidationError
from aiptrain.planning import install_container
from aiptrain.staging import sha256_of

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


def ensure_installed(
    backend: Backend,
    image: str,
    package_dir: Path,
    package_files: list[str],
    wheelhouse: str | None,
    cache_dir: Path,
    user: str,
    labels: dict[str, str],
) -> tuple[Path, bool]:
    """(the installed user base for these packages on this image, whether it was installed now).
    A failed install is the package's fault: one line, exit 2, nothing left behind. The install
    container carries the job's labels, so a submit killed meanwhile is cleaned up with its job."""
    installs = cache_dir / "installs"
    target = installs / install_key(backend.image_id(image), package_dir, package_files, wheelhouse)
    if (target / COMPLETE).is_file():
        os.utime(target)  # recently used: what the cache pruning goes by
        return target, False
    installs.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=installs, prefix=".installing-"))
    try:
        if os.getuid() == 0:  # the install runs as the replicas' user
            uid, gid = (int(part) for part in user.split(":"))
            os.chown(scratch, uid, gid)
        spec = install_container(image, str(package_dir), tuple(package_files), wheelhouse, str(scratch), user,
                                 labels)
        status, output = backend.run_to_completion(spec)
        if status != 0:
            last = (output.strip().splitlines() or [f"exit status {status}"])[-1]
            raise ValidationError(
                f"Installing the job's packages in [{image}] failed: {last} Fix the package (its setup.py "
                "or install_requires) and submit again."
            )
        (scratch / COMPLETE).write_text(image + "\n")
        try:
            scratch.rename(target)
        except OSError:  # a concurrent submit installed the same packages first: use theirs
            shutil.rmtree(scratch, ignore_errors=True)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return target, True

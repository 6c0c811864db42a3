"""Build the trainer's source distribution the way gcloud does (jobs_prep.py).

The package's parent directory is the "package root". If it has a setup.py, that
is used; otherwise a minimal one is generated for the package. Unlike gcloud, which
writes the generated setup.py into the user's tree and deletes it afterwards, we
build from a copy in a temporary directory, so the user's tree is never touched,
even if we are killed half way.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aiptrain.errors import ValidationError

GENERATED_SETUP_PY = """\
from setuptools import setup, find_packages

if __name__ == '__main__':
    setup(name={name!r}, packages=find_packages(include=[{name!r}, {name!r} + '.*']))
"""

# Never copied into the build: version control, caches, virtual environments, old builds.
IGNORED = shutil.ignore_patterns(
    ".git", ".hg", ".svn", "__pycache__", "*.pyc", ".venv", "venv", ".tox", ".mypy_cache",
    ".pytest_cache", "*.egg-info", "build", "dist", "node_modules",
)


@dataclass(frozen=True)
class BuiltPackage:
    path: Path  # the sdist, inside a directory the caller owns
    sha256: str


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _packaging_failed(output: str, generated: bool) -> ValidationError:
    if generated:
        hint = "Try manually writing a setup.py file at your package root and rerunning the command."
    else:
        hint = (
            "Try manually building your Python code by running:\n  $ python setup.py sdist\n"
            "and providing the output via the `--packages` flag (for example, "
            "`--packages dist/package.tar.gz,dist/package2.whl)`"
        )
    return ValidationError(f"Packaging of user Python code failed with message:\n\n{output.strip()}\n\n{hint}")


def build_sdist(package_path: Path, out_dir: Path) -> BuiltPackage:
    """Build an sdist of the package at `package_path` into `out_dir` (which must exist)."""
    package_root = package_path.parent
    user_setup = package_root / "setup.py"
    with tempfile.TemporaryDirectory(prefix="aiptrain-sdist-") as tmp:
        build_root = Path(tmp) / "root"
        if user_setup.is_file():
            shutil.copytree(package_root, build_root, ignore=IGNORED, symlinks=True)
        else:
            shutil.copytree(package_path, build_root / package_path.name, ignore=IGNORED, symlinks=True)
            (build_root / "setup.py").write_text(GENERATED_SETUP_PY.format(name=package_path.name))
        dist_dir = Path(tmp) / "dist"
        result = subprocess.run(
            [sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(dist_dir)],
            cwd=build_root,
            capture_output=True,
            text=True,
        )
        built = sorted(dist_dir.glob("*")) if dist_dir.is_dir() else []
        if result.returncode != 0 or not built:
            raise _packaging_failed(result.stdout + result.stderr, generated=not user_setup.is_file())
        target = out_dir / built[0].name
        shutil.move(built[0], target)
    return BuiltPackage(target, sha256_of(target))

"""Build the trainer's source distribution the way gcloud does (jobs_prep.py).

The package's parent directory is the "package root". If it has a setup.py, that
is used; otherwise a minimal one is generated for the package. Unlike gcloud, which
writes the generated setup.py into the user's tree and deletes it afterwards, we
build from a copy in a temporary directory, so the user's tree is never touched,
even if we are killed half way.

Built sdists are cached by the content of the tree they were built from: resubmitting
an unchanged trainer reuses the very same file, so its sha256 (and the staging path
that contains it) is stable and nothing needs building or uploading again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aiptrain.cache import touch
from aiptrain.errors import ValidationError
from aiptrain.staging import sha256_of
from aiptrain.storage.local import feed_file

log = logging.getLogger(__name__)

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
    # The same build as a wheel, when asked for and setuptools could make one: what the install
    # may unpack on the host for a pure-Python trainer (aiptrain.installs). The sdist stays what
    # is staged, as gcloud stages it.
    wheel: Path | None = None


def _packaging_failed(output: str, package_root: Path, generated: bool) -> ValidationError:
    """gcloud's message on one line: the line of the build's output that names the error, then
    the way out; the whole output goes to the log (`--verbosity info`)."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    problem = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "")
    logging.getLogger(__name__).info("The package's build printed:\n%s", output.strip())
    if generated:
        hint = "Try manually writing a setup.py file at your package root and rerunning the command"
    else:
        hint = (f"Try manually building your Python code by running `python setup.py sdist` in [{package_root}] "
                "and providing the output via the `--packages` flag (for example, "
                "`--packages dist/package.tar.gz,dist/package2.whl`)")
    return ValidationError(
        f"Packaging of user Python code failed: {problem.rstrip('.')}. {hint} "
        "(`--verbosity info` shows the build's full output)."
    )


def build_sdist(package_path: Path, out_dir: Path, wheel_dir: Path | None = None) -> BuiltPackage:
    """Build an sdist of the package at `package_path` into `out_dir` (which must exist), and a
    wheel into `wheel_dir` when given, in the same setuptools run (a tenth of a second more). The
    wheel is an extra: a package whose wheel does not build still gets its sdist."""
    package_root = package_path.parent
    user_setup = package_root / "setup.py"
    with tempfile.TemporaryDirectory(prefix="aiptrain-sdist-") as tmp:
        build_root = Path(tmp) / "root"
        if user_setup.is_file():
            shutil.copytree(package_root, build_root, ignore=IGNORED, symlinks=True)
        else:
            shutil.copytree(package_path, build_root / package_path.name, ignore=IGNORED, symlinks=True)
            (build_root / "setup.py").write_text(GENERATED_SETUP_PY.format(name=package_path.name))
        dist_dir, wheels_dir = Path(tmp) / "dist", Path(tmp) / "wheels"
        wheel_args = ["bdist_wheel", "--dist-dir", str(wheels_dir)] if wheel_dir is not None else []
        result = _setup_py(build_root, ["sdist", "--dist-dir", str(dist_dir), *wheel_args])
        built = sorted(dist_dir.glob("*")) if dist_dir.is_dir() else []
        if wheel_args and not built:  # the wheel's failure may have stopped the sdist: build it alone
            wheel_args = []
            result = _setup_py(build_root, ["sdist", "--dist-dir", str(dist_dir)])
            built = sorted(dist_dir.glob("*")) if dist_dir.is_dir() else []
        if not built or (result.returncode != 0 and not wheel_args):  # a failed wheel alone costs only the wheel
            raise _packaging_failed(result.stdout + result.stderr, package_root, generated=not user_setup.is_file())
        target = out_dir / built[0].name
        shutil.move(built[0], target)
        wheels = sorted(wheels_dir.glob("*.whl")) if wheel_args and result.returncode == 0 and wheels_dir.is_dir() else []
        wheel = None
        if wheel_dir is not None and len(wheels) == 1:
            wheel = wheel_dir / wheels[0].name
            shutil.move(wheels[0], wheel)
    return BuiltPackage(target, sha256_of(target), wheel)


def _setup_py(build_root: Path, commands: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "setup.py", "-q", *commands], cwd=build_root, capture_output=True,
                          text=True)


# -- the sdist cache ---------------------------------------------------------------------------

CACHE_FORMAT = "2"  # bump when what goes into a tree hash, or an entry, changes (2: the wheel beside)
WHEEL_DIR = "wheel"  # in a cache entry, beside the sdist


def _build_input(package_path: Path) -> tuple[Path, list[str] | None]:
    """(directory copied into the build, the names in it to take or None for all) as build_sdist."""
    package_root = package_path.parent
    if (package_root / "setup.py").is_file():
        return package_root, None
    return package_root, [package_path.name]


def _walk(directory: Path, names: list[str] | None, relative: str = "") -> list[tuple[str, Path]]:
    """Every entry copytree(ignore=IGNORED, symlinks=True) would copy, sorted: (relative path, path)."""
    listed = sorted(os.listdir(directory)) if names is None else sorted(n for n in names if (directory / n).exists())
    ignored = IGNORED(str(directory), listed)
    entries = []
    for name in listed:
        if name in ignored:
            continue
        path = directory / name
        rel = f"{relative}{name}"
        entries.append((rel, path))
        if path.is_dir() and not path.is_symlink():
            entries.extend(_walk(path, None, rel + "/"))
    return entries


def source_tree_hash(package_path: Path) -> str:
    """A digest of what an sdist of `package_path` is built from: every file's path, executable
    bit and content (symlinks by target), skipping what the build skips; plus the builder
    (generated setup.py or not, setuptools and Python versions)."""
    from importlib.metadata import PackageNotFoundError, version

    directory, names = _build_input(package_path)
    digest = hashlib.sha256()

    def feed(*parts: str | bytes) -> None:
        for part in parts:
            data = part.encode() if isinstance(part, str) else part
            digest.update(len(data).to_bytes(8, "big") + data)

    try:
        setuptools_version = version("setuptools")
    except PackageNotFoundError:
        setuptools_version = "none"
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    feed(CACHE_FORMAT, setuptools_version, python)
    feed("generated" if names else "setup.py", GENERATED_SETUP_PY if names else "")
    for rel, path in _walk(directory, names):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            feed("link", rel, os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            feed("dir", rel)
        elif stat.S_ISREG(info.st_mode):
            feed("file", rel, "x" if info.st_mode & 0o111 else "-")
            feed(feed_file(hashlib.sha256(), path).digest())
    return digest.hexdigest()


def cached_sdist(package_path: Path, cache_dir: Path) -> BuiltPackage:
    """The sdist of `package_path` (and its wheel, when aiptrain generated its setup.py), from
    `cache_dir/sdists/<tree hash>/` when the tree is unchanged since it was built, else built
    now and kept there. The returned files belong to the cache: read them, never move or delete
    them."""
    tree_hash = source_tree_hash(package_path)
    entry = cache_dir / "sdists" / tree_hash
    cached = _cached(entry)
    if cached:
        log.debug("Reusing the cached sdist %s (source tree %s unchanged).", cached.path.name, tree_hash[:12])
        touch(entry)  # its last use, for cache pruning
        return cached
    log.debug("Building an sdist of %s (source tree %s not in the cache).", package_path, tree_hash[:12])
    shutil.rmtree(entry, ignore_errors=True)  # an entry someone emptied
    entry.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the entry and rename it into place: readers never see half an entry, and
    # of two submits building the same tree at once, the first rename wins.
    partial = Path(tempfile.mkdtemp(prefix=f".{tree_hash[:12]}-", dir=entry.parent))
    try:
        # A wheel only of a build aiptrain's own setup.py drives: a trainer's own setup.py may do
        # anything, and it runs where the service runs it, in the image (aiptrain.installs).
        generated = _build_input(package_path)[1] is not None
        if generated:
            (partial / WHEEL_DIR).mkdir()
        built = build_sdist(package_path, partial, partial / WHEEL_DIR if generated else None)
        try:
            os.rename(partial, entry)
        except OSError:
            theirs = _cached(entry)
            if not theirs:
                raise
            log.debug("Another submit cached the same tree first; using its sdist.")
            return theirs
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    wheel = entry / WHEEL_DIR / built.wheel.name if built.wheel else None
    return BuiltPackage(entry / built.path.name, built.sha256, wheel)


def _cached(entry: Path) -> BuiltPackage | None:
    sdists = sorted(p for p in entry.iterdir() if p.is_file()) if entry.is_dir() else []
    if not sdists:
        return None
    wheels = sorted((entry / WHEEL_DIR).glob("*.whl"))
    return BuiltPackage(sdists[0], sha256_of(sdists[0]), wheels[0] if len(wheels) == 1 else None)

"""Build the trainer's source distribution the way gcloud does (jobs_prep.py).

The package's parent directory is the "package root". If it has a setup.py, that
is used; otherwise a minimal one is generated for the package. Unlike gcloud, which
writes the generated setup.py into the user's tree and deletes it afterwards, we
build from a copy in a temporary directory, so the user's tree is never touched,
even if we are killed half way.

Built sdists are cached by the content of the tree they were built from: resubmitting
an unchanged trainer reuses the very same file, so its sha256 (and the staging path
that contains it) is stable and nothing needs building or uploading again.

A package with no setup.py of its own whose tree is plain (regular files and directories
only) is built here, without a setuptools process: what the generated setup.py would give is
fixed (every `*.py` of every package under it, a `0.0.0` version, no dependencies), and a
setuptools run costs half a second of every changed trainer's submit, mostly its imports.
Anything else (links, names setuptools reads otherwise) still goes to setuptools. What is
neither a file, a directory nor a link (a FIFO, a socket) is never part of a build, nor is the
aiptrain home when it is kept inside the project.
tests/unit/test_packaging.py builds trees both ways and compares what each archive holds.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import io
import logging
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
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
IGNORED_NAMES = shutil.ignore_patterns(
    ".git", ".hg", ".svn", "__pycache__", "*.pyc", ".venv", "venv", ".tox", ".mypy_cache",
    ".pytest_cache", "*.egg-info", "build", "dist", "node_modules",
)


Ignore = Callable[[str, Iterable[str]], set[str]]  # copytree's `ignore`: the names in a directory to skip


def ignoring(leave_out: Collection[Path] = ()) -> Ignore:
    """copytree's `ignore` for the build's copy: IGNORED_NAMES; what is neither a file, a
    directory nor a link (a FIFO, a socket, a device: no sdist holds one, and copying one
    fails); and the directories in `leave_out` (an aiptrain home kept in the project, whose
    files change with every job and may be large)."""
    left_out = set()
    for path in leave_out:
        with contextlib.suppress(OSError):
            info = os.stat(path)
            left_out.add((info.st_dev, info.st_ino))

    def ignore(directory: str, names: Iterable[str]) -> set[str]:
        names = list(names)
        skipped = set(IGNORED_NAMES(directory, names))
        for name in names:
            if name in skipped:
                continue
            try:
                info = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            special = not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode) or stat.S_ISLNK(info.st_mode))
            if special or (stat.S_ISDIR(info.st_mode) and (info.st_dev, info.st_ino) in left_out):
                skipped.add(name)
        return skipped

    return ignore


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


def build_sdist(package_path: Path, out_dir: Path, wheel_dir: Path | None = None,
                leave_out: Collection[Path] = ()) -> BuiltPackage:
    """Build an sdist of the package at `package_path` into `out_dir` (which must exist), and a
    wheel into `wheel_dir` when given: here for a plain tree with no setup.py of its own, else
    with setuptools. The directories in `leave_out` are not part of the build (`ignoring`)."""
    if not (package_path.parent / "setup.py").is_file():
        modules = plain_package_modules(package_path, leave_out)
        if modules is not None:
            return _build_generated(package_path, modules, out_dir, wheel_dir)
    return build_with_setuptools(package_path, out_dir, wheel_dir, leave_out)


def build_with_setuptools(package_path: Path, out_dir: Path, wheel_dir: Path | None = None,
                          leave_out: Collection[Path] = ()) -> BuiltPackage:
    """build_sdist in a setuptools process (`setup.py sdist`, with `bdist_wheel` in the same run
    when a wheel is wanted: a tenth of a second more). The wheel is an extra: a package whose
    wheel does not build still gets its sdist."""
    package_root = package_path.parent
    user_setup = package_root / "setup.py"
    ignore = ignoring(leave_out)
    with tempfile.TemporaryDirectory(prefix="aiptrain-sdist-") as tmp:
        build_root = Path(tmp) / "root"
        if user_setup.is_file():
            shutil.copytree(package_root, build_root, ignore=ignore, symlinks=True)
        else:
            shutil.copytree(package_path, build_root / package_path.name, ignore=ignore, symlinks=True)
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


# -- a generated setup.py's build, without setuptools -------------------------------------------

GENERATED_VERSION = "0.0.0"  # setuptools' version of a setup() that names none
WHEEL_GENERATOR = "aiptrain"
SETUP_CFG = "[egg_info]\ntag_build = \ntag_date = 0\n\n"  # what setuptools' sdist adds


def plain_package_modules(package_path: Path, leave_out: Collection[Path] = ()) -> list[str] | None:
    """The modules the generated setup.py builds from the package, as paths relative to its
    root (`trainer/task.py`), sorted: every `*.py` but hidden ones of the package and of each
    package below it (find_packages looks only into directories with an `__init__.py` and no
    dot in the name; build_py takes `*.py`). None when the tree holds what setuptools would
    read otherwise: a link, a directory named `*.py`, a name that is not UTF-8, or a package
    name that is not an ASCII identifier. What the build leaves out (`ignoring`) is not looked at."""
    if not (package_path.name.isidentifier() and package_path.name.isascii()):
        return None
    return _package_modules(package_path, package_path.name, ignoring(leave_out))


def _package_modules(directory: Path, relative: str, ignore: Ignore) -> list[str] | None:
    names = sorted(os.listdir(directory))
    ignored = ignore(str(directory), names)
    modules: list[str] = []
    for name in names:
        if name in ignored:
            continue
        path = directory / name
        try:
            name.encode()
        except UnicodeEncodeError:
            return None
        info = path.lstat()
        if stat.S_ISDIR(info.st_mode):
            if name.endswith(".py"):
                return None
            if "." not in name and (path / "__init__.py").is_file():
                below = _package_modules(path, f"{relative}/{name}", ignore)
                if below is None:
                    return None
                modules += below
        elif not stat.S_ISREG(info.st_mode):
            return None
        elif name.endswith(".py") and not name.startswith("."):
            modules.append(f"{relative}/{name}")
    return sorted(modules)


def _build_generated(package_path: Path, modules: list[str], out_dir: Path,
                     wheel_dir: Path | None) -> BuiltPackage:
    """The sdist (and wheel) setuptools builds with the generated setup.py, written directly.
    Times are the files' own and gzip's is zero: the same files give the same bytes."""
    name, root = package_path.name, package_path.parent
    pkg_info = f"Metadata-Version: 2.1\nName: {name}\nVersion: {GENERATED_VERSION}\n"
    egg_info = {
        "PKG-INFO": pkg_info,
        # setuptools sorts its file list by (directory, name)
        "SOURCES.txt": "\n".join(sorted(["setup.py", *modules, *(f"{name}.egg-info/{n}" for n in (
            "PKG-INFO", "SOURCES.txt", "dependency_links.txt", "top_level.txt"))], key=os.path.split)),
        "dependency_links.txt": "\n",
        "top_level.txt": f"{name}\n",
    }
    generated = {"PKG-INFO": pkg_info, "setup.cfg": SETUP_CFG, "setup.py": GENERATED_SETUP_PY.format(name=name),
                 **{f"{name}.egg-info/{n}": text for n, text in egg_info.items()}}
    base = f"{name}-{GENERATED_VERSION}"
    target = out_dir / f"{base}.tar.gz"
    _write_sdist(target, base, root, modules, generated)
    wheel = None
    if wheel_dir is not None:
        wheel = wheel_dir / f"{base}-py3-none-any.whl"
        _write_wheel(wheel, f"{base}.dist-info", root, modules, {
            "METADATA": pkg_info + "\n",
            "WHEEL": f"Wheel-Version: 1.0\nGenerator: {WHEEL_GENERATOR}\nRoot-Is-Purelib: true\nTag: py3-none-any\n\n",
            "top_level.txt": f"{name}\n",
        })
    return BuiltPackage(target, sha256_of(target), wheel)


def _write_sdist(target: Path, base: str, root: Path, modules: list[str], generated: dict[str, str]) -> None:
    """The sdist: the modules as they are (mode and time), the generated files beside them, and
    a directory entry for each directory that holds one, all under `base/`."""
    stamp = max((int(root.joinpath(rel).stat().st_mtime) for rel in modules), default=0)
    directories = sorted({parent for rel in [*modules, *generated] for parent in _parents(rel)})
    with open(target, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for rel in ["", *directories]:
            info = tarfile.TarInfo(f"{base}/{rel}".rstrip("/"))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, stamp
            archive.addfile(info)
        for rel in modules:
            info = archive.gettarinfo(str(root / rel), f"{base}/{rel}")
            info.uid, info.gid, info.uname, info.gname = 0, 0, "", ""  # whose files they were is nobody's business
            with open(root / rel, "rb") as handle:
                archive.addfile(info, handle)
        for rel, text in generated.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{base}/{rel}")
            info.size, info.mode, info.mtime = len(data), 0o644, stamp
            archive.addfile(info, io.BytesIO(data))


def _parents(relative: str) -> list[str]:
    parts = relative.split("/")[:-1]
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _write_wheel(target: Path, dist_info: str, root: Path, modules: list[str], metadata: dict[str, str]) -> None:
    """A pure wheel (PEP 427): the modules, then the .dist-info with its RECORD of hashes."""
    record = []
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        files = [(rel, (root / rel).read_bytes(), (root / rel).stat().st_mode) for rel in modules]
        files += [(f"{dist_info}/{n}", text.encode(), 0o644) for n, text in metadata.items()]
        for rel, data, mode in files:
            entry = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
            entry.external_attr = (stat.S_IFREG | (mode & 0o777)) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{rel},sha256={digest},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        entry = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(1980, 1, 1, 0, 0, 0))
        entry.external_attr = (stat.S_IFREG | 0o644) << 16
        archive.writestr(entry, "\n".join(record) + "\n", zipfile.ZIP_DEFLATED)


# -- the sdist cache ---------------------------------------------------------------------------

CACHE_FORMAT = "3"  # bump when what goes into a tree hash, or an entry, changes (2: the wheel beside; 3: built here)
WHEEL_DIR = "wheel"  # in a cache entry, beside the sdist


def _build_input(package_path: Path) -> tuple[Path, list[str] | None]:
    """(directory copied into the build, the names in it to take or None for all) as build_sdist."""
    package_root = package_path.parent
    if (package_root / "setup.py").is_file():
        return package_root, None
    return package_root, [package_path.name]


def _walk(directory: Path, names: list[str] | None, ignore: Ignore, relative: str = "") -> list[tuple[str, Path]]:
    """Every entry copytree(ignore=ignore, symlinks=True) would copy, sorted: (relative path, path)."""
    listed = sorted(os.listdir(directory)) if names is None else sorted(n for n in names if (directory / n).exists())
    ignored = ignore(str(directory), listed)
    entries = []
    for name in listed:
        if name in ignored:
            continue
        path = directory / name
        rel = f"{relative}{name}"
        entries.append((rel, path))
        if path.is_dir() and not path.is_symlink():
            entries.extend(_walk(path, None, ignore, rel + "/"))
    return entries


def source_tree_hash(package_path: Path, leave_out: Collection[Path] = ()) -> str:
    """A digest of what an sdist of `package_path` is built from: every file's path, executable
    bit and content (symlinks by target), skipping what the build skips; plus the builder
    (generated setup.py or not, setuptools and Python versions)."""
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
    for rel, path in _walk(directory, names, ignoring(leave_out)):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            feed("link", rel, os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            feed("dir", rel)
        elif stat.S_ISREG(info.st_mode):
            feed("file", rel, "x" if info.st_mode & 0o111 else "-")
            feed(feed_file(hashlib.sha256(), path).digest())
    return digest.hexdigest()


def cached_sdist(package_path: Path, cache_dir: Path, leave_out: Collection[Path] = ()) -> BuiltPackage:
    """The sdist of `package_path` (and its wheel, when aiptrain generated its setup.py), from
    `cache_dir/sdists/<tree hash>/` when the tree is unchanged since it was built, else built
    now and kept there; the directories in `leave_out` are not part of the tree. The returned
    files belong to the cache: read them, never move or delete them."""
    tree_hash = source_tree_hash(package_path, leave_out)
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
        built = build_sdist(package_path, partial, partial / WHEEL_DIR if generated else None, leave_out)
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

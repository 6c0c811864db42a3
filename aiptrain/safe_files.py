"""Files a trainer controls, handled by the host side (which may run as root).

A job dir, a bucket kept on this machine and a trial's metric directory are written by
replicas: any name in them may be a symlink (to /etc, to /dev/zero), a FIFO or a huge file by
the time the host looks. So everything below a trusted base directory is reached one component
at a time from directory descriptors, never following a link (O_NOFOLLOW, O_DIRECTORY, the
`dir_fd` forms of mkdir/chown/open); files are opened non-blocking, read only when they are
regular files, and never past a size bound. The base itself (a job dir the user named, the
home's gcs root) is trusted: replicas cannot replace it, only what is inside.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from aiptrain.errors import ValidationError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
READ_BLOCK = 1 << 20


class UnsafePath(ValidationError):
    """A name inside a trainer's directory that is not what it must be (a link, a FIFO, too big)."""


def _parts(relative: str | os.PathLike) -> list[str]:
    parts = [p for p in PurePosixPath(os.fspath(relative)).parts if p not in ("", ".", "/")]
    if ".." in parts:
        raise UnsafePath(f"[{relative}] leaves its directory.")
    return parts


def _open_below(base_fd: int, name: str, path_for_errors: str) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=base_fd)
    except OSError as exc:
        if exc.errno in (40, 20):  # ELOOP (a symlink), ENOTDIR (a file or a link to one)
            raise UnsafePath(f"[{path_for_errors}] is not a directory (a link or a file put there): remove it, "
                             "or choose another path.") from None
        raise


@contextlib.contextmanager
def open_dir(base: Path, relative: str | os.PathLike = "", create: bool = False,
             mode: int = 0o755) -> Iterator[int]:
    """A descriptor of the directory `base/relative`, reached without following any link below
    `base`; with `create`, missing directories are made on the way. FileNotFoundError when it
    does not exist (and `create` is off); UnsafePath when a component is a link or not a directory."""
    fd = os.open(base, DIR_FLAGS & ~os.O_NOFOLLOW)  # the base is trusted, links to it included
    try:
        walked = Path(base)
        for name in _parts(relative):
            walked = walked / name
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, mode, dir_fd=fd)
            child = _open_below(fd, name, str(walked))
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def make_dirs(base: Path, relative: str | os.PathLike, owner: tuple[int, int] | None = None,
              mode: int = 0o755) -> Path:
    """mkdir -p of `base/relative` that never follows a link; with `owner` (uid, gid) the last
    directory is handed to it through its descriptor, so a link planted there cannot redirect
    the chown. Returns the path."""
    with open_dir(base, relative, create=True, mode=mode) as fd:
        if owner is not None:
            os.fchown(fd, *owner)
    return Path(base) / relative


def _entries(fd: int, budget: list[int]) -> list[os.DirEntry]:
    """The entries of a directory descriptor, within what is left of the walk's budget."""
    entries = []
    with os.scandir(os.dup(fd)) as listing:  # scandir closes the descriptor it is given
        for entry in listing:
            if budget[0] <= 0:
                break
            budget[0] -= 1
            entries.append(entry)
    return entries


@contextlib.contextmanager
def open_regular(dir_fd: int, name: str, limit: int, path_for_errors: str = "") -> Iterator[int]:
    """A descriptor of the regular file `name` in the directory `dir_fd`: never through a link,
    never blocking (a FIFO or a device is refused, not opened for good), at most `limit` bytes.
    FileNotFoundError when it does not exist; UnsafePath when it is not such a file."""
    shown = path_for_errors or name
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (40, 20):  # ELOOP: a symlink; ENOTDIR
            raise UnsafePath(f"[{shown}] is a link: not read.") from None
        if exc.errno == 6:  # ENXIO: a FIFO without a writer, opened non-blocking for writing... or a socket
            raise UnsafePath(f"[{shown}] is not a regular file: not read.") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePath(f"[{shown}] is not a regular file: not read.")
        if info.st_size > limit:
            raise UnsafePath(f"[{shown}] is larger than {limit} bytes: not read.")
        yield fd
    finally:
        os.close(fd)


def read_bounded(fd: int, limit: int) -> bytes:
    """At most `limit` bytes from a descriptor (a file that grew past its bound is cut)."""
    blocks, left = [], limit
    while left > 0:
        block = os.read(fd, min(READ_BLOCK, left))
        if not block:
            break
        blocks.append(block)
        left -= len(block)
    return b"".join(blocks)


def read_file(base: Path, relative: str | os.PathLike, limit: int) -> bytes | None:
    """The bytes of the regular file `base/relative` (see open_regular), or None when it does
    not exist. UnsafePath when it is a link, a FIFO, a device or larger than `limit`."""
    *dirs, name = _parts(relative) or [""]
    try:
        with (open_dir(base, PurePosixPath(*dirs) if dirs else "") as dir_fd,
              open_regular(dir_fd, name, limit, str(Path(base) / relative)) as fd):
            return read_bounded(fd, limit)
    except FileNotFoundError:
        return None


def find_files(base: Path, relative: str | os.PathLike, matches, max_depth: int = 8,
               max_entries: int = 10_000) -> Iterator[tuple[str, int, str]]:
    """(path relative to `base/relative`, descriptor of its directory, name) of every name below
    it for which `matches(name)` holds, never descending through a link, at most `max_depth` levels
    and `max_entries` names in all (a trainer can make millions). Open each with open_regular
    while the iteration is at it: the descriptor is closed once the walk moves on."""
    try:
        with open_dir(base, relative) as fd:
            yield from _find_below(fd, "", matches, max_depth, [max_entries])
    except (FileNotFoundError, UnsafePath):
        return


def _find_below(fd: int, prefix: str, matches, depth: int, budget: list[int]) -> Iterator[tuple[str, int, str]]:
    directories = []
    for entry in sorted(_entries(fd, budget), key=lambda e: e.name):
        shown = f"{prefix}{entry.name}"
        if entry.is_dir(follow_symlinks=False):
            directories.append(entry.name)
        elif matches(entry.name):
            yield shown, fd, entry.name
    if depth <= 0:
        return
    for name in directories:
        try:
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
        except OSError:
            continue  # replaced by a link or removed meanwhile
        try:
            yield from _find_below(child, f"{prefix}{name}/", matches, depth - 1, budget)
        finally:
            os.close(child)


def partial_name(name: str) -> str:
    """Where `name` is written before it is renamed into place: unique to this process and thread,
    so two writers (two submits, or two threads of one pipeline) never rename each other's file."""
    return f".{name}.partial-{os.getpid()}-{threading.get_ident()}"

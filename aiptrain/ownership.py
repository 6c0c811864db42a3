"""Who owns what: whoever holds a lock file (flock).

A job's lock is held by its submit from before the job is recorded until it is queued for the
controller; the controller leaves a job alone while its lock is held, and adopts it (removing the
lock file) once it is free. The home's controller lock is held by the one controller of an
aiptrain home (aiptrain.runner.control hands it to the process it starts, inherited). When a
holder dies, the kernel releases its lock: no PIDs, so no PID reuse.

Lock files of jobs that ended (or were never recorded) are removed, and only by a
holder, while it holds the lock. A taker may have opened the file just before it was
unlinked and then lock an inode no longer at the path; so every taker checks, once it
holds the lock, that the path still names the inode it locked, and starts over when
it does not. Two processes therefore never both believe they hold a job's lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class JobLock:
    def __init__(self, fd: int, path: Path):
        self.fd = fd
        self.path = path

    @classmethod
    def try_acquire(cls, path: Path) -> JobLock | None:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            if _still_at(path, fd):
                return cls(fd, path)
            os.close(fd)  # its holder removed it after we opened it: take the file now there

    def release(self) -> None:
        """Close our descriptor; the lock lives on in any child that inherited it."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def remove(self) -> None:
        """Unlink the lock file, then release: for a job nobody will drive again. Only while
        holding it, and only when no child inherited it (the child would lose its claim)."""
        if self.fd >= 0 and _still_at(self.path, self.fd):
            self.path.unlink(missing_ok=True)
        self.release()

    def __enter__(self) -> JobLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _still_at(path: Path, fd: int) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


def remove_if_unowned(path: Path) -> bool:
    """Remove a lock file nobody holds (of a job that ended or never started); True if removed."""
    lock = JobLock.try_acquire(path)
    if lock is None:
        return False
    lock.remove()
    return True

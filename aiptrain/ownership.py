"""Who is driving a job: whoever holds the job's lock file.

Submit takes the lock before it records the job and hands the very same lock (the
open file, inherited) to the detached supervisor, so there is no moment when a live
job has no owner. When the owner dies, the kernel releases the lock: any command
that can take it knows the job is orphaned and reconciles it while holding it, so
two commands never reconcile the same job at once. No PIDs, so no PID reuse.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class JobLock:
    def __init__(self, fd: int):
        self.fd = fd

    @classmethod
    def try_acquire(cls, path: Path) -> "JobLock | None":
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return cls(fd)

    def release(self) -> None:
        """Close our descriptor; the lock lives on in any child that inherited it."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "JobLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def is_owned(path: Path) -> bool:
    """True while some live process holds the job's lock."""
    lock = JobLock.try_acquire(path)
    if lock is None:
        return True
    lock.release()
    return False

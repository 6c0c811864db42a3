"""Job lock files: a removed lock is never held twice, only unheld lock files are removed,
and reading a job removes the lock of a submit killed before it recorded the job."""

from __future__ import annotations

import os

from aiptrain.jobpaths import JobPaths
from aiptrain.ownership import JobLock, remove_if_unowned

# -- lock files ---------------------------------------------------------------------------------


def test_a_removed_lock_is_never_held_twice(tmp_path):
    """A taker that opened the file before its holder removed it must not believe it holds
    the job's lock once it locks the orphaned inode."""
    path = tmp_path / "job.lock"
    holder = JobLock.try_acquire(path)
    late_fd = os.open(path, os.O_RDWR)  # a taker between its open() and its flock()
    holder.remove()
    assert not path.exists()
    fresh = JobLock.try_acquire(path)  # takes the file now at the path, not the old inode
    assert fresh is not None and path.exists()
    assert os.fstat(fresh.fd).st_ino != os.fstat(late_fd).st_ino
    assert JobLock.try_acquire(path) is None  # held: nobody else gets it
    os.close(late_fd)
    fresh.remove()
    assert not path.exists()


def test_only_unheld_lock_files_are_removed(tmp_path):
    path = tmp_path / "job.lock"
    held = JobLock.try_acquire(path)
    assert remove_if_unowned(path) is False and path.exists()
    held.release()
    assert remove_if_unowned(path) is True and not path.exists()


def test_reading_a_job_removes_the_lock_of_a_submit_killed_before_it_recorded_it(cli, home, tmp_path):
    lock = JobPaths(home, "never_recorded").lock
    lock.parent.mkdir(parents=True)
    lock.touch()
    outside = tmp_path / "outside.lock"
    outside.touch()
    assert cli("jobs", "describe", "never_recorded").returncode == 2
    assert not lock.exists()
    cli("jobs", "describe", f"../../{outside.stem}")  # not a job ID: nothing outside the home is touched
    assert outside.exists()

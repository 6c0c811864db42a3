"""aiptrain cache prune: old entries first, then the least recently used, and stale locks."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from aiptrain import cache
from aiptrain.jobpaths import JobPaths

DAY = 86400.0


NOW = 100 * DAY


def entry(name: str, days_idle: float, mib: int, partial: bool = False) -> cache.Entry:
    return cache.Entry(Path(name), NOW - days_idle * DAY, mib * 2**20, partial)


@pytest.mark.parametrize(
    "found, max_age_days, max_mib, removed",
    [
        ([entry("old", 40, 1), entry("fresh", 1, 1)], 30, 100, ["old"]),
        # over the size limit: least recently used first, until it fits
        ([entry("a", 5, 40), entry("b", 3, 40), entry("c", 1, 40)], 30, 50, ["a", "b"]),
        # used within the hour: kept whatever the limits
        ([entry("busy", 0.01, 500)], 0, 0, []),
        # a half-built entry goes once it is an hour old, however young the age limit says
        ([entry(".partial", 0.5, 1, partial=True), entry(".new", 0.01, 1, partial=True)], 30, 100, [".partial"]),
        ([], 30, 100, []),
    ],
)
def test_cache_prune_chooses_old_then_least_recently_used(found, max_age_days, max_mib, removed):
    chosen = cache.choose(found, NOW, max_age_days * DAY, max_mib * 2**20)
    assert [str(e.path) for e in chosen] == removed


def test_cache_prune_command_removes_old_entries_and_stale_locks(cli, home):
    old, fresh = home / "cache" / "sdists" / "old", home / "cache" / "wheelhouses" / "fresh"
    for directory in (old, fresh):
        directory.mkdir(parents=True)
        (directory / "pkg.tar.gz").write_bytes(b"x" * 1000)
    index = home / "cache" / "staged-objects.json"
    index.write_text("{}")
    long_ago = time.time() - 90 * DAY
    os.utime(old, (long_ago, long_ago))
    os.utime(index, (long_ago, long_ago))
    gone_lock = JobPaths(home, "gone_job").lock
    gone_lock.parent.mkdir()
    gone_lock.touch()

    dry = cli("cache", "prune", "--dry-run", check_code=0)
    assert old.exists() and "Would remove 2 cache entries" in dry.stderr
    result = cli("cache", "prune", check_code=0)
    assert not old.exists() and not index.exists() and fresh.exists()
    assert "Removed 2 cache entries" in result.stderr and "1 stale lock file(s)" in result.stderr
    assert result.stderr.count("\n") == 1
    assert not gone_lock.exists()

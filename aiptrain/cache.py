"""Pruning the cache under AIPTRAIN_HOME/cache: built sdists (`sdists/`), resolved
dependency wheelhouses (`wheelhouses/`), the runtime images' wheels (`wheelhouse/`), the
packages installed once per image (`installs/`) and the staged-object index
(`staged-objects.json`). Everything there can be made again; keeping it only saves time.
Installs are kept while any job is active: running replicas mount them.

An entry's last use is its modification time (a submit that reuses an entry touches it).
Entries unused for longer than the age limit go; then, while the cache is over its size
limit, the least recently used go. Entries used within the last hour always stay: a
submit may be reading them. Half-built entries (`.name-*`, left by a killed submit) go once
they are that old. Submit prunes at most once a day, `aiptrain cache prune` on demand.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from aiptrain.settings import Settings
from aiptrain.store import JobStore

log = logging.getLogger(__name__)

IN_USE_SECONDS = 3600
AUTO_PRUNE_EVERY_SECONDS = 24 * 3600
ENTRY_DIRS = ("sdists", "wheelhouses", "wheelhouse", "installs")
MOUNTED_BY_REPLICAS = "installs"
STAGED_INDEX = "staged-objects.json"
LAST_PRUNE = ".last-prune"


@dataclass(frozen=True)
class Entry:
    path: Path
    last_used: float  # seconds since the epoch
    size: int  # bytes
    partial: bool = False  # a build that never finished


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


def entries(cache_dir: Path) -> list[Entry]:
    found = []
    for name in ENTRY_DIRS:
        directory = cache_dir / name
        if not directory.is_dir():
            continue
        for path in directory.iterdir():
            found.append(Entry(path, path.lstat().st_mtime, _size(path), partial=path.name.startswith(".")))
    index = cache_dir / STAGED_INDEX
    if index.is_file():
        found.append(Entry(index, index.stat().st_mtime, index.stat().st_size))
    return found


def choose(found: list[Entry], now: float, max_age_seconds: float, max_bytes: int,
           in_use_seconds: float = IN_USE_SECONDS) -> list[Entry]:
    """The entries to remove (pure): too old or half-built, then the least recently used
    while the rest is over `max_bytes`; never one used within `in_use_seconds`."""
    def idle(entry: Entry) -> float:
        return now - entry.last_used

    removable = [e for e in found if idle(e) > in_use_seconds]
    chosen = [e for e in removable if e.partial or idle(e) > max_age_seconds]
    total = sum(e.size for e in found) - sum(e.size for e in chosen)
    for entry in sorted((e for e in removable if e not in chosen), key=lambda e: e.last_used):
        if total <= max_bytes:
            break
        chosen.append(entry)
        total -= entry.size
    return chosen


@dataclass(frozen=True)
class PruneResult:
    removed: list[Entry]
    kept_bytes: int

    @property
    def freed_bytes(self) -> int:
        return sum(e.size for e in self.removed)


def prune(settings: Settings, max_age_days: float | None = None, max_size_mb: float | None = None,
          dry_run: bool = False) -> PruneResult:
    max_age_days = settings.cache_max_age_days if max_age_days is None else max_age_days
    max_size_mb = settings.cache_max_size_mb if max_size_mb is None else max_size_mb
    found = entries(settings.cache_dir)
    if _jobs_active(settings):
        found = [e for e in found if e.path.parent.name != MOUNTED_BY_REPLICAS]
    chosen = choose(found, time.time(), max_age_days * 86400, int(max_size_mb * 2**20))
    if not dry_run:
        for entry in chosen:
            log.debug("Pruning %s from the cache.", entry.path)
            if entry.path.is_dir() and not entry.path.is_symlink():
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                entry.path.unlink(missing_ok=True)
    return PruneResult(chosen, sum(e.size for e in found) - sum(e.size for e in chosen))


def _jobs_active(settings: Settings) -> bool:
    if not settings.store_url and not settings.store_path.exists():
        return False

    store = JobStore.of(settings)
    try:
        return bool(store.active_job_ids())
    finally:
        store.close()


def prune_if_due(settings: Settings) -> None:
    """Prune with the configured limits if the last prune is a day old; never fails a submit."""
    stamp = settings.cache_dir / LAST_PRUNE
    try:
        if stamp.exists() and time.time() - stamp.stat().st_mtime < AUTO_PRUNE_EVERY_SECONDS:
            return
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.touch()
        prune(settings)
    except OSError as exc:
        log.debug("Pruning the cache failed: %s", exc)


def touch(entry: Path) -> None:
    """Mark a cache entry as used now (it is reused, not rebuilt)."""
    try:
        os.utime(entry)
    except OSError:
        pass

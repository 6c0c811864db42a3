"""`aiptrain cache ...`: keeping AIPTRAIN_HOME/cache (and leftover lock files) in bounds."""

from __future__ import annotations

import click


@click.group()
def cache() -> None:
    """Inspect and prune aiptrain's cache of sdists, wheelhouses and staged objects."""


@cache.command()
@click.option("--max-age-days", type=click.FloatRange(min=0),
              help="Remove entries unused for longer than this [default: $AIPTRAIN_CACHE_MAX_AGE_DAYS or 30].")
@click.option("--max-size-mb", type=click.FloatRange(min=0),
              help="Then remove the least recently used until the cache fits "
                   "[default: $AIPTRAIN_CACHE_MAX_SIZE_MB or 10240].")
@click.option("--dry-run", is_flag=True, help="List what would be removed and remove nothing.")
def prune(max_age_days, max_size_mb, dry_run) -> None:
    """Remove cache entries unused for a while, and lock files of jobs that ended.

    Entries used within the last hour are always kept: a submit may be reading them.
    Everything removed is rebuilt when a job needs it again.
    """
    from aiptrain import cache as cache_lib
    from aiptrain.jobs import remove_stale_locks
    from aiptrain.settings import Settings
    from aiptrain.store import JobStore

    settings = Settings()
    settings.ensure_dirs()
    result = cache_lib.prune(settings, max_age_days, max_size_mb, dry_run)
    for entry in result.removed:
        click.echo(f"{'would remove' if dry_run else 'removed'}\t{_mib(entry.size)}\t{entry.path}")
    locks = 0 if dry_run else remove_stale_locks(settings, JobStore.of(settings))
    verb = "Would remove" if dry_run else "Removed"
    click.echo(f"{verb} {len(result.removed)} cache entr{'y' if len(result.removed) == 1 else 'ies'} "
               f"({_mib(result.freed_bytes)}) and {locks} stale lock file(s); the cache holds "
               f"{_mib(result.kept_bytes)}.", err=True)


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"

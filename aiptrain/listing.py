"""What `jobs list` does below the CLI, without the pydantic model: reconcile the active jobs
nobody drives, let the store filter, sort and limit in SQL what it can, finish the rest with
gcloud's filter in Python, and hand back REST resources as dicts.

aiptrain.Client.list goes through here too. The CLI calls it directly so that printing a table
of thousands of jobs imports neither pydantic nor the engine, and parses no stored resource
when the table shows only columns the store keeps (jobId, state, createTime, labels).
"""

from __future__ import annotations

from typing import Callable, Iterable

from aiptrain import filtering
from aiptrain.jobtable import DamagedRecord, JobTable
from aiptrain.ownership import JobLock
from aiptrain.settings import Settings


def undriven(settings: Settings, table: JobTable) -> list[str]:
    """Active jobs whose lock nobody holds: their submitter or supervisor died, so a reader
    must reconcile them before it reports their state. Jobs that ended are not looked at."""
    orphans = []
    for job_id in table.active_job_ids():
        lock = JobLock.try_acquire(settings.job_lock_path(job_id))
        if lock is not None:
            lock.release()  # reconciling takes it again, and checks once more
            orphans.append(job_id)
    return orphans


def list_resources(settings: Settings, reconcile: Callable[[str], None], filter: str | None = None,
                   sort_by: str | Iterable[str] | None = None, limit: int | None = None,
                   fields: Iterable[str] | None = None, table: JobTable | None = None) -> list[dict]:
    """The jobs `jobs list` selects (gcloud's --filter, --sort-by with `~` for descending,
    --limit; newest first by default) as resources. `fields`: the only keys the caller reads,
    None for whole resources; `reconcile(job_id)` takes over an active job nobody drives;
    `table`: the open store (else the settings' store is opened and closed)."""
    expression = filtering.parse(filter) if filter else None
    keys = filtering.parse_sort_keys(sort_by)
    if table is None:
        with JobTable(settings.store_path) as table:
            return list_resources(settings, reconcile, filter, sort_by, limit, fields, table)
    for job_id in undriven(settings, table):
        try:
            reconcile(job_id)
        except DamagedRecord as exc:  # said once, and that job only is left as it is
            table.skip_damaged(job_id, exc.problem)
    query = filtering.plan_query(expression, keys, limit)
    if query.complete:
        return table.resources(query, fields)
    found = table.resources(query)
    return filtering.select(found, expression, keys, limit, lambda resource: resource)

"""What `jobs list` does below the CLI, without the pydantic model: make sure the home's
controller runs while jobs are active, let the store filter, sort and limit in SQL what it can, finish the rest with
gcloud's filter in Python, and hand back REST resources as dicts.

aiptrain.Client.list goes through here too. The CLI calls it directly so that printing a table
of thousands of jobs imports neither pydantic nor the engine, and parses no stored resource
when the table shows only columns the store keeps (jobId, state, createTime, labels).
"""

from __future__ import annotations

from collections.abc import Iterable

from aiptrain import filtering
from aiptrain.jobtable import JobTable
from aiptrain.runner import control
from aiptrain.settings import Settings


def list_resources(settings: Settings, filter: str | None = None,
                   sort_by: str | Iterable[str] | None = None, limit: int | None = None,
                   fields: Iterable[str] | None = None, table: JobTable | None = None,
                   project: str | None = None, after: tuple[str, str] | None = None) -> list[dict]:
    """The jobs of `project` (default: the settings' default project) that `jobs list` selects
    (gcloud's --filter, --sort-by with `~` for descending, --limit; newest first by default) as
    resources. `fields`: the only keys the caller reads, None for whole resources; `table`: the
    open store (else the settings' store is opened and closed); `after`: (createTime, jobId) of
    the last job of the page before (the REST list's page token), for the default order only."""
    expression = filtering.parse(filter) if filter else None
    keys = filtering.parse_sort_keys(sort_by)
    if table is None:
        with JobTable.of(settings) as table:
            return list_resources(settings, filter, sort_by, limit, fields, table, project, after)
    if table.active_job_ids():
        control.ensure_running(settings)  # a controller that died is replaced: its jobs go on
    project = project or settings.default_project
    query = filtering.plan_query(expression, keys, limit, after)
    if query.complete:
        return table.resources(query, fields, project)
    found = table.resources(query, project=project)
    return filtering.select(found, expression, keys, limit, lambda resource: resource)

"""What a job façade offers, whichever installation runs the jobs: `JobService`, the verbs the
CLI and the API's handlers call. `aiptrain.client.Client` runs them on this installation;
`aiptrain.remote.ApiClient` on another one, through its REST API. Neither imports the other:
both follow this protocol (mypy checks it where `open_client` returns either, and
tests/unit/test_job_service.py compares their signatures with it).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from aiptrain.config import SubmitFlags
from aiptrain.logs import LogRecord
from aiptrain.model import Job
from aiptrain.replicas import ReplicaObservation

if TYPE_CHECKING:
    from aiptrain.submission import Submission
    from aiptrain.tfjob import Export
    from aiptrain.trainjob import Runtime, TrainJobExport


@dataclass(frozen=True)
class LabelsUpdate:
    """What `update_labels` did: the job after it, and whether its labels changed."""

    job: Job
    changed: bool


class JobService(Protocol):
    """The job verbs, as `aiptrain jobs ...` uses them (docstrings: aiptrain.client.Client)."""

    def close(self) -> None: ...

    def __enter__(self) -> JobService: ...

    def __exit__(self, *exc: Any) -> None: ...

    def prepare(self, flags: SubmitFlags, base: Job | None = None) -> Submission: ...

    def submit(self, submission: Submission, report: Callable[[str], None] | None = None,
               build_progress: Callable[[str], None] | None = None) -> Job: ...

    def dry_run_tfjob(self, submission: Submission) -> Export: ...

    def export_tfjob(self, job_id: str) -> Export: ...

    def dry_run_trainjob(self, submission: Submission, runtime: Runtime | None = None) -> TrainJobExport: ...

    def export_trainjob(self, job_id: str, runtime: Runtime | None = None) -> TrainJobExport: ...

    def get(self, job_id: str) -> Job: ...

    def list_resources(self, filter: str | None = None, sort_by: str | Iterable[str] | None = None,
                       limit: int | None = None, fields: Iterable[str] | None = None) -> builtins.list[dict]: ...

    @property
    def local_gcs_root(self) -> Path | None: ...

    def job_ids(self, prefix: str = "") -> builtins.list[str]: ...

    def waiting_reason(self, job_id: str) -> str | None: ...

    def uri(self, job_id: str, project: str | None = None) -> str: ...

    def wait(self, job_id: str, timeout: float | None = None) -> Job: ...

    def log_batches(self, job_id: str, task_name: str | None = None, poll_seconds: float = 0.2,
                    on_poll: Callable[[Job], None] | None = None) -> Iterator[builtins.list[LogRecord]]: ...

    def log_blocks(self, job_id: str, poll_seconds: float = 0.2) -> Iterator[bytes]: ...

    def replicas(self, job_id: str) -> builtins.list[ReplicaObservation]: ...

    def restart_counts(self, job_id: str) -> dict[str, int]: ...

    def cancel(self, job_id: str, timeout: float = 60) -> Job: ...

    def update_labels(self, job_id: str, update: dict[str, str] | None = None,
                      remove: Iterable[str] = (), clear: bool = False) -> LabelsUpdate: ...

    def list(self, filter: str | None = None, sort_by: str | Iterable[str] | None = None,
             limit: int | None = None) -> builtins.list[Job]: ...

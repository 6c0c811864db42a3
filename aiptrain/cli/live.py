"""The terminal view of `stream-logs` and `submit --stream-logs`: gcloud's fields with the task
column coloured per replica and the severity coloured, and a live status line below the
scrolling logs (replicas starting / running / restarted / exited, elapsed time).

Only on a terminal: through a pipe or in CI the plain lines of aiptrain.logs.format_record are
printed instead (aiptrain.cli.jobs._print_logs decides). Docker is asked about the replicas at
most once a second, from the thread that follows the log; rich's refresh thread only renders."""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone

from rich.console import Console
from rich.live import Live
from rich.text import Text

from aiptrain import logs
from aiptrain.backends import ReplicaStatus

SEVERITY_STYLES = {"DEBUG": "dim", "INFO": "green", "NOTICE": "cyan", "WARNING": "yellow",
                   "ERROR": "red", "CRITICAL": "bold red", "ALERT": "bold red", "EMERGENCY": "bold red"}
TASK_PALETTE = ("cyan", "magenta", "blue", "bright_green", "bright_magenta", "bright_cyan", "bright_blue",
                "dark_orange")
OBSERVE_EVERY_SECONDS = 1.0


def task_style(task: str) -> str:
    """One colour per replica, the same in every run; the service's lines dim."""
    if task == logs.SERVICE:
        return "dim"
    return TASK_PALETTE[zlib.crc32(task.encode()) % len(TASK_PALETTE)]


def styled_lines(record: logs.LogRecord, allow_multiline: bool) -> list[Text]:
    """The plain line's fields, tab-separated as gcloud prints them, with colours."""
    lines = []
    for line in logs.format_record(record, allow_multiline):
        severity, stamp, task, trial, message = line.split("\t", 4)
        text = Text(no_wrap=False)
        text.append(severity, SEVERITY_STYLES.get(severity, ""))
        text.append(f"\t{stamp}\t", "dim")
        text.append(task, task_style(task))
        text.append(f"\t{trial}\t")
        text.append(logs.printable(message))  # shown, not obeyed
        lines.append(text)
    return lines


@dataclass
class Status:
    """What the status line shows; updated by the log-following thread, rendered by rich's."""

    state: str = "QUEUED"
    since: datetime | None = None
    counts: dict[ReplicaStatus, int] = field(default_factory=dict)
    restarted: int = 0

    def line(self, now: datetime | None = None) -> Text:
        now = now or datetime.now(timezone.utc)
        seconds = int((now - self.since).total_seconds()) if self.since else 0
        elapsed = f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        text = Text()
        text.append(f"{self.state:<10}", "bold")
        text.append(" replicas: ")
        counts = self.counts
        parts = [(counts.get(ReplicaStatus.CREATED, 0), "starting", "yellow"),
                 (counts.get(ReplicaStatus.RUNNING, 0), "running", "green"),
                 (self.restarted, "restarted", "magenta"), (counts.get(ReplicaStatus.EXITED, 0), "exited", "dim")]
        for index, (count, label, style) in enumerate(parts):
            text.append(f"{count} {label}", style if count else "dim")
            if index < len(parts) - 1:
                text.append(" · ", "dim")
        text.append(f"   {elapsed}", "bold")
        return text

    def __rich__(self) -> Text:
        return self.line()


class _Watcher:
    """Refreshes a Status from the job and, at most once a second, from the engine."""

    def __init__(self, client, job_id: str, status: Status):
        self.client, self.job_id, self.status = client, job_id, status
        self._observed_at = 0.0

    def __call__(self, job) -> None:
        self.status.state = job.state.value
        self.status.since = job.start_time or job.create_time
        if job.state.is_terminal or time.monotonic() - self._observed_at < OBSERVE_EVERY_SECONDS:
            return
        self._observed_at = time.monotonic()
        try:
            replicas = self.client.replicas(self.job_id)
        except Exception:  # noqa: BLE001 - the status line is a convenience: the logs go on
            return
        counts: dict[ReplicaStatus, int] = {}
        for replica in replicas:
            counts[replica.status] = counts.get(replica.status, 0) + 1
        self.status.counts = counts
        self.status.restarted = sum(1 for n in self.client.restart_counts(self.job_id).values() if n)


def print_live(client, job_id: str, task_name: str | None, allow_multiline: bool, err: bool,
               poll_seconds: float = 0.2) -> None:
    console = Console(stderr=err, highlight=False, markup=False, emoji=False)
    status = Status()
    watcher = _Watcher(client, job_id, status)
    with Live(status, console=console, refresh_per_second=4, transient=True, redirect_stdout=False,
              redirect_stderr=False) as live:
        for batch in client.log_batches(job_id, task_name, poll_seconds, on_poll=watcher):
            for record in batch:
                for line in styled_lines(record, allow_multiline):
                    live.console.print(line, soft_wrap=True)
    job = client.get(job_id)
    watcher(job)
    console.print(status.line(job.end_time or datetime.now(timezone.utc)))

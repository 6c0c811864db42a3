"""Replicas' output into the job's JSON-lines log, one thread per replica.

Each follower streams its container's output from the engine and appends it to the job's log,
stamped with the task (and trial) it came from. A follower re-attached after a restart, or by a
new controller, starts a little before the last line already copied and skips the lines the log
holds (the engine's timestamp of each line is kept in the log), so no line is lost or copied
twice, though the engine's stdout and stderr stamps interleave. A group's end waits for its followers to
copy everything (`drained`), however long that takes while they make progress.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from aiptrain.backends import Backend, ReplicaObservation, ReplicaStatus
from aiptrain.logs import JobLogWriter, parse_engine_time, record_line, records_of_task, severity_of

DRAIN_PATIENCE_SECONDS = 15  # a follower that copied nothing for this long is given up on
# The engine stamps stdout and stderr lines as it reads each pipe, so its stream may hold a line
# stamped before lines of the other stream that came ahead of it: a resumed copy starts this
# much before the last line copied and skips the lines the log holds already.
RESUME_OVERLAP_NS = 1_000_000_000


class LogFollowers:
    """The followers of one job's replicas, keyed by (trial, task): every trial of a tuning job
    has its own master-replica-0."""

    def __init__(self, backend: Backend, writer: JobLogWriter, resume_from: dict[tuple[str, str], str],
                 log_path: Path | None = None):
        """`log_path`: the log `writer` appends to, read when a copy resumes (without it, a
        resumed copy starts right after the last line copied)."""
        self._backend = backend
        self._writer = writer
        self._log_path = log_path
        self._last_stamp = dict(resume_from)  # the engine's time of the last line copied
        self._threads: dict[tuple[str, str], threading.Thread] = {}
        self._drained: set[tuple[str, str]] = set()  # exited replicas whose output is all copied
        self.batches = 0  # batches copied so far, by every thread: their progress

    def sync(self, observations: list[ReplicaObservation]) -> None:
        """Follow every observed replica not followed yet (or any more)."""
        for obs in observations:
            key = (obs.trial_id, obs.task_name)
            thread = self._threads.get(key)
            if thread and thread.is_alive():
                continue
            if obs.status == ReplicaStatus.EXITED and key in self._drained:
                continue
            thread = threading.Thread(target=self._follow, args=(obs,), daemon=True,
                                      name=f"logs-{obs.trial_id}-{obs.task_name}")
            self._threads[key] = thread
            thread.start()

    def restarted(self, trial_id: str, task_name: str) -> None:
        self._drained.discard((trial_id, task_name))

    def _follow(self, obs: ReplicaObservation) -> None:
        key = (obs.trial_id, obs.task_name)
        since = self._last_stamp.get(key)
        task, trial = obs.task_name, obs.trial_id
        since_ns = parse_engine_time(since) if since else None
        copied: set[int] = set()
        if since_ns is not None and self._log_path is not None:
            since_ns -= RESUME_OVERLAP_NS
            copied = self._copied_from(trial, task, since_ns)
        try:
            for chunks in self._backend.follow_logs(obs.container_id or "", since_ns):
                fresh = [chunk for chunk in chunks if not copied or parse_engine_time(chunk.time) not in copied]
                if fresh:
                    self._writer.write_lines([
                        record_line(chunk.time, task, severity_of(chunk.stream, chunk.text), chunk.text, trial)
                        for chunk in fresh
                    ])
                self._last_stamp[key] = chunks[-1].time
                self.batches += 1
        except Exception:  # the container vanished under us: its logs went with it
            pass
        if obs.status == ReplicaStatus.EXITED:
            self._drained.add(key)

    def _copied_from(self, trial: str, task: str, since_ns: int) -> set[int]:
        """The engine times of the task's lines that the log holds from `since_ns` on."""
        assert self._log_path is not None
        times = (parse_engine_time(r.time) for r in records_of_task(self._log_path, task) if r.trial == trial)
        return {moment for moment in times if moment >= since_ns}

    def copying(self, trial_id: str | None = None) -> bool:
        """Whether any follower (of one trial, when given) is still copying."""
        return any(thread.is_alive() for (trial, _), thread in list(self._threads.items())
                   if trial_id is None or trial == trial_id)


class Drain:
    """Waiting, without blocking, for a group's followers to copy everything: done once none
    copies any more, or once none has copied anything for `patience` seconds."""

    def __init__(self, followers: LogFollowers, trial_id: str | None, patience: float = DRAIN_PATIENCE_SECONDS):
        self._followers, self._trial_id, self._patience = followers, trial_id, patience
        self._progress, self._stalled_since = followers.batches, time.monotonic()

    def done(self) -> bool:
        if not self._followers.copying(self._trial_id):
            return True
        if self._followers.batches != self._progress:
            self._progress, self._stalled_since = self._followers.batches, time.monotonic()
        return time.monotonic() - self._stalled_since >= self._patience

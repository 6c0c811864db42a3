"""Admission: which queued job may start now, on a machine that cannot run every job at once.

One pure rule, table-tested (`decide`), over what the store knows:

- Jobs wait in QUEUED, in the order they asked to start (`Queued`, oldest first): only the
  oldest waiting job may start, so a small job never overtakes a big one that waits.
- It starts when the replicas of the jobs already admitted plus its own fit under the cap,
  or when nothing else runs (a job larger than the cap still runs, alone).
- The cap is AIPTRAIN_MAX_RUNNING_REPLICAS when set (0: no cap), otherwise derived from the
  host (`capacity`): REPLICAS_PER_CORE per core, and no more than the memory actually free
  holds at REPLICA_MEMORY each (on top of what the admitted replicas already use).
- A job that waited longer than its scheduling.maxWaitTime without reaching RUNNING is
  cancelled (`waited_too_long`), as the service does.

A study (hyperparameter tuning job) holds its trials' replicas: one trial's replicas times
the trials it runs at once, admitted as one job, so its trials never wait on each other. It runs
maxParallelTrials at once where they fit under the cap, else as many as fit (one at least, as a
job larger than the cap runs alone: `trials_at_once`); its other trials wait for those to end.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from aiptrain.model import HyperparameterSpec, Job
from aiptrain.topology import replicas_for

# Replicas per core: a replica of a distributed job spends much of its time waiting on its
# peers (parameter servers, all-reduce, input pipelines), so two per core keep the cores busy;
# more only slows every running step down without finishing anything sooner.
REPLICAS_PER_CORE = 2
# Memory one replica is counted for: a 2.11-runtime replica fitting a small Keras model peaks at
# about 385 MiB (measured), so a GiB leaves room for its data; the machine types have far more.
REPLICA_MEMORY_BYTES = 1 << 30
NO_CAP = 1 << 62  # AIPTRAIN_MAX_RUNNING_REPLICAS=0


@dataclass(frozen=True)
class Capacity:
    replicas: int  # how many replicas may run at once
    why: str  # where that number comes from, for messages


@dataclass(frozen=True)
class Queued:
    """A job waiting to start, as the store lists them (oldest first)."""

    job_id: str
    replicas: int


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    position: int = 0  # 1 for the next job to start; 0 once admitted (the service's jobPosition)
    reason: str | None = None  # why it waits


def capacity(used: int, cpus: int, available_memory: int, override: int | None) -> Capacity:
    """The cap on running replicas while `used` replicas run: the override, or the host's cores
    and free memory (free memory already excludes what running replicas use, so they are added back)."""
    if override is not None:
        if override == 0:
            return Capacity(NO_CAP, "AIPTRAIN_MAX_RUNNING_REPLICAS=0: no cap")
        return Capacity(override, f"AIPTRAIN_MAX_RUNNING_REPLICAS={override}")
    by_cores = max(1, cpus) * REPLICAS_PER_CORE
    by_memory = used + available_memory // REPLICA_MEMORY_BYTES
    # No free-memory figure in the text: it changes all the time, and the reason is logged when it changes.
    why = (f"{REPLICAS_PER_CORE} per core on {cpus} cores and 1 per GiB of free memory; "
           "set AIPTRAIN_MAX_RUNNING_REPLICAS to change it")
    return Capacity(max(1, min(by_cores, by_memory)), why)


def replicas_needed(replicas_per_run: int, parallel_trials: int | None = None) -> int:
    """What a job holds once admitted: its replicas, times its parallel trials for a study."""
    return replicas_per_run * max(1, parallel_trials or 1)


def needed_by(job: Job, cpus: int, override: int | None) -> int:
    """The replicas `job` holds once admitted: a study holds those of the trials it runs at once
    on this machine (`trials_at_once`), as it never starts more."""
    per_run = len(replicas_for(job.training_input))
    spec = job.training_input.hyperparameters
    if not spec:
        return per_run
    return replicas_needed(per_run, trials_at_once(spec, per_run, cpus, override).trials)


def study_cap(cpus: int, override: int | None) -> tuple[int | None, str]:
    """The cap a study's trials are bounded by at submit (None: no cap), and why: the override,
    or the host's cores. Free memory is left out: it changes from one moment to the next, and
    admission waits for it anyway."""
    if override == 0:
        return None, "AIPTRAIN_MAX_RUNNING_REPLICAS=0: no cap"
    if override is not None:
        return override, f"AIPTRAIN_MAX_RUNNING_REPLICAS={override}"
    return max(1, cpus) * REPLICAS_PER_CORE, f"{REPLICAS_PER_CORE} per core on {cpus} core{'s' if cpus != 1 else ''}"


def parallel_trials_allowed(replicas_per_trial: int, cpus: int, override: int | None) -> tuple[int | None, str]:
    """How many trials of a study may run at once on this machine (None: no bound), and why: as
    many as fit under the cap on running replicas (one at least, as a job larger than the cap runs
    alone)."""
    cap, why = study_cap(cpus, override)
    if cap is None:
        return None, why
    return max(1, cap // max(1, replicas_per_trial)), why


@dataclass(frozen=True)
class TrialsAtOnce:
    """How many of a study's trials run at once on this machine, and why."""

    trials: int  # run at once here
    asked: int  # maxParallelTrials, at most maxTrials
    parallel_limit: int  # maxParallelTrials as given
    replicas_per_trial: int
    cap: int | None  # replicas the machine runs at once (study_cap); None: no cap
    why: str  # where the cap comes from

    @property
    def bounded(self) -> bool:
        """Fewer at once than the spec asks for: the rest wait for earlier trials to end."""
        return self.trials < self.asked

    def notice(self) -> str | None:
        """The one-line warning submit gives (and the job's log keeps) for a bounded study."""
        if not self.bounded or self.cap is None:
            return None
        per_trial, cap = self.replicas_per_trial, self.cap
        each = f"{per_trial} replica{'s' if per_trial > 1 else ''} each"
        alone = "; a trial larger than that runs alone" if per_trial > cap else ""
        return (f"trainingInput.hyperparameters.maxParallelTrials [{self.parallel_limit}]: this machine runs "
                f"{self.trials} of the study's trials at once ({each}; at most {cap} replica{'s' if cap > 1 else ''} "
                f"at once: {self.why}{alone}), and starts its other trials as earlier ones end. "
                "Set AIPTRAIN_MAX_RUNNING_REPLICAS to change it (0: no cap).")


def trials_at_once(spec: HyperparameterSpec, replicas_per_trial: int, cpus: int, override: int | None) -> TrialsAtOnce:
    """How many of the study's trials run at once here: maxParallelTrials (at most maxTrials), or
    as many as fit under the cap when fewer (`parallel_trials_allowed`). A valid study is never
    refused for the machine's size: the trials beyond the bound wait for earlier ones to end."""
    asked = min(spec.parallel_limit, spec.trials_limit)
    cap, why = study_cap(cpus, override)
    allowed, _ = parallel_trials_allowed(replicas_per_trial, cpus, override)
    trials = min(asked, allowed or asked)
    return TrialsAtOnce(trials, asked, spec.parallel_limit, replicas_per_trial, cap, why)


def trials_held(held: int, replicas_per_trial: int, asked: int) -> int:
    """How many trials a study admitted with `held` replicas runs at once: as many as those
    replicas hold (admission counted them at submit, `needed_by`), one at least, at most `asked`."""
    return max(1, min(asked, held // max(1, replicas_per_trial)))


def decide(job_id: str, queue: Sequence[Queued], used: int, cap: Capacity) -> Verdict:
    """May `job_id` (in `queue`, the waiting jobs oldest first) start now, with `used` replicas
    of admitted jobs running? Only the oldest may, and only if it fits or nothing runs."""
    position = next(i for i, entry in enumerate(queue, 1) if entry.job_id == job_id)
    need = queue[position - 1].replicas
    if position > 1:
        ahead = position - 1
        return Verdict(False, position, f"Waiting behind {ahead} job{'s' if ahead > 1 else ''} submitted earlier: "
                                        "queued jobs start in submission order.")
    if used == 0 or used + need <= cap.replicas:
        return Verdict(True)
    return Verdict(False, position, (
        f"Waiting for capacity: {used} replica{'s' if used > 1 else ''} of other jobs running, this job needs "
        f"{need}, and at most {cap.replicas} run at once ({cap.why})."
    ))


def waited_too_long(create_time: datetime, now: datetime, max_wait_seconds: float | None) -> bool:
    return max_wait_seconds is not None and now - create_time > timedelta(seconds=max_wait_seconds)


def available_memory() -> int:
    """Bytes of memory free for new processes: Linux's MemAvailable (page cache it may drop
    included), else free pages."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def host_capacity(used: int, override: int | None) -> Capacity:
    """`capacity` on this host, now."""
    if override is not None:
        return capacity(used, 0, 0, override)
    return capacity(used, os.cpu_count() or 1, available_memory(), None)


def request(store, key: str, job: Job, override: int | None) -> Verdict:
    """Queue `job` (`key`: its key in the store, aiptrain.jobkeys) once and admit it if the rule
    allows, under the store's write lock."""
    def rule(queue: list[Queued], used: int) -> Verdict:
        return decide(key, queue, used, host_capacity(used, override))

    return store.request_admission(key, needed_by(job, os.cpu_count() or 1, override), rule)


def peek(store, key: str, job: Job, override: int | None) -> Verdict | None:
    """The verdict `request` would give now, read without the write lock (for the waiting loop:
    cheap enough to ask often); None when the job is not queued."""
    queue, used = store.admission_queue()
    if not any(entry.job_id == key for entry in queue):
        return None
    return decide(key, queue, used, host_capacity(used, override))

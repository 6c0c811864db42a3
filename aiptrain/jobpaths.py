"""Every file one job has in the home, named in one place: `JobPaths`.

A job's files are named by its key (aiptrain.jobkeys), never by its ID alone: two projects may
both have a job `census_1`. docs/design/home-layout.md lists the same paths with who writes and
who removes each, and tests/unit/test_job_paths.py holds the two together. Pure path arithmetic:
nothing here reads or writes the disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LOGS_DIR = "logs"  # in the home: one log per job
LOCKS_DIR = "locks"  # in the home: one lock per job whose submit is at work
WORK_DIR = "work"  # in the home: one directory per active job
CONTRACTS_DIR = "contracts"  # in the home: what a job of another dialect told its replicas
LOCK_SUFFIX = ".lock"
# The packages' dependencies, as wheels: beside the packages in the bucket (aiptrain.staging)
# and in the job's packages directory, which replicas see at planning.PACKAGES_DIR.
WHEELHOUSE = "wheelhouse"


def metric_file_name(task_name: str) -> str:
    """cloudml-hypertune's metric file of one replica (CLOUD_ML_HP_METRIC_FILE), in its trial's
    metrics directory; the replicas see that directory at planning.HYPERTUNE_DIR."""
    return f"{task_name}.metrics"


@dataclass(frozen=True)
class JobPaths:
    """The files of the job `key` in the home `home` (Settings.job_paths)."""

    home: Path
    key: str

    @property
    def log(self) -> Path:
        """The job's log, a JSON line per record (aiptrain.logs): submit writes the service's
        lines up to the queueing, the controller every replica's output and the rest."""
        return self.home / LOGS_DIR / f"{self.key}.jsonl"

    @property
    def lock(self) -> Path:
        """A submit at work: submit takes its flock before it records the job and lets go once
        the job is queued; the controller removes it when it adopts the job (aiptrain.ownership)."""
        return self.home / LOCKS_DIR / f"{self.key}{LOCK_SUFFIX}"

    @property
    def work_dir(self) -> Path:
        """The job's host-side files while it is active (below): made by submit, removed by the
        controller when the job ends, or by a refused submit."""
        return self.home / WORK_DIR / self.key

    @property
    def packages(self) -> Path:
        """The job's packages, mounted read-only into its replicas: filled by submit."""
        return self.work_dir / "packages"

    @property
    def wheelhouse(self) -> Path:
        """The packages' dependencies as wheels, beside them: linked in by submit."""
        return self.packages / WHEELHOUSE

    @property
    def plan_inputs(self) -> Path:
        """What the job, or each trial of a study, is planned from (planning.PlanInputs as JSON):
        written by submit, read by the controller when it launches the job or a trial."""
        return self.work_dir / "plan-inputs.json"

    @property
    def contract(self) -> Path:
        """What a job of another dialect (Vertex AI's) told its replicas (planning.ReplicaContract
        as JSON): written by submit beside the plan inputs, and kept when the job ends, so that
        `jobs export` gives its pods the same; removed with the job's log."""
        return self.home / CONTRACTS_DIR / f"{self.key}.json"

    @property
    def launch_started(self) -> Path:
        """Empty: a launch of the job (not a study) began. The controller makes it before it
        launches; a successor that finds it removes what the cut launch made, then launches."""
        return self.work_dir / "launch-started"

    @property
    def launched_dir(self) -> Path:
        """A study's launch markers, one per trial (`launched`): the controller's, never mounted."""
        return self.work_dir / "launched"

    def launched(self, trial_id: str) -> Path:
        """Empty: the trial's launch completed (made by the controller); a trial recorded
        without it was cut while launching."""
        return self.launched_dir / trial_id

    @property
    def trials_dir(self) -> Path:
        """A study's trials' metrics directories: removed by the controller when the study ends."""
        return self.work_dir / "trials"

    def trial_dir(self, trial_id: str) -> Path:
        """One trial's metrics directory, made by the controller and mounted read-write into the
        trial's replicas at planning.HYPERTUNE_DIR: they write it, the controller reads it."""
        return self.trials_dir / trial_id

    def metric_file(self, trial_id: str, task_name: str) -> Path:
        """One replica's cloudml-hypertune file in its trial's metrics directory: written by that
        replica, read by the controller (the master's is the trial's metric)."""
        return self.trial_dir(trial_id) / metric_file_name(task_name)

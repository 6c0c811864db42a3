"""Hyperparameter tuning: the study loop of a job whose trainingInput has `hyperparameters`.

It runs inside the job's supervisor process. Each trial is the job's whole replica
topology, planned with the trial's values (`planning.plan(..., trial=...)`), launched on
the same backend and driven by the same per-group steps as a plain job (restarts,
lifecycle.decide, log following). `schedule()` is the one rule for the study itself:
how many trials to start now, and when the study is over. The search (which values a
trial gets) is aiptrain.search, on optuna.

Every trial is recorded in the job's trainingOutput before its replicas start, and
again when it ends, so a supervisor that dies mid-study is replaced by one that
adopts the trials still running and never loses a finished one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from aiptrain.errors import AiptrainError
from aiptrain.lifecycle import Decision
from aiptrain.model import HyperparameterOutput, HyperparameterSpec, Job, Metric, State, TrainingOutput, utc_now
from aiptrain.planning import PlanInputs, Trial, inputs_from_dict, inputs_to_dict, plan
from aiptrain.topology import replicas_for

log = logging.getLogger(__name__)

PLAN_INPUTS_FILE = "plan-inputs.json"  # in the job's work dir: what every trial is planned from
PRIMARY_TASK = "master-replica-0"  # whose reports are the trial's metric, as on the service
STUDY_SEED = 0  # the same spec explores the same points: studies are reproducible


# -- the study rule (pure) --------------------------------------------------------------------


@dataclass(frozen=True)
class StudyCounts:
    """Where a study stands."""

    budget: int  # trials it may run in all (maxTrials, or fewer when the search space is smaller)
    started: int
    running: int
    succeeded: int
    failed: int


@dataclass(frozen=True)
class StudyStep:
    start: int = 0  # trials to start now
    end: State | None = None  # the job's final state, once the study is over
    reason: str | None = None  # why it failed


def failure_limit(max_failed_trials: int | None, budget: int) -> int:
    """How many failed trials fail the job. maxFailedTrials 0 (unset) leaves it to the
    service; aiptrain's rule is half the trials, rounded up: a trainer that fails every
    time stops early, one that fails now and then still finishes its study."""
    if max_failed_trials:
        return max_failed_trials
    return max(1, math.ceil(budget / 2))


def schedule(counts: StudyCounts, max_parallel: int, max_failed: int | None) -> StudyStep:
    """What to do next: start trials up to maxParallelTrials while the budget lasts; fail
    the job once too many trials failed; end it when nothing runs and nothing is left."""
    limit = failure_limit(max_failed, counts.budget)
    if counts.failed >= limit:
        return StudyStep(end=State.FAILED, reason=f"{counts.failed} of the trials failed (the limit is {limit}).")
    room = min(max_parallel - counts.running, counts.budget - counts.started)
    if room > 0:
        return StudyStep(start=room)
    if counts.running == 0:
        if counts.succeeded:
            return StudyStep(end=State.SUCCEEDED)
        return StudyStep(end=State.FAILED, reason="No trial succeeded.")
    return StudyStep()


# -- what submit leaves for the study ---------------------------------------------------------


def save_plan_inputs(work_dir: Path, inputs: PlanInputs) -> None:
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / PLAN_INPUTS_FILE).write_text(json.dumps(inputs_to_dict(inputs)))


def load_plan_inputs(work_dir: Path) -> PlanInputs:
    return inputs_from_dict(json.loads((work_dir / PLAN_INPUTS_FILE).read_text()))


def first_trial(spec: HyperparameterSpec, metrics_dir: str) -> Trial:
    """The trial the study starts with: what `--dry-run` shows of a tuning job."""
    from aiptrain.search import Search

    return Trial("1", Search(spec, seed=STUDY_SEED).suggest("1") or {}, metrics_dir)


# -- metric files ---------------------------------------------------------------------------


def read_metrics(path: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) reports under `tag`, oldest first, from a cloudml-hypertune metric file:
    JSON lines, values and steps as strings; the library rewrites the whole file on each
    report (keeping the last 100), so a read may catch it half-written: such lines are skipped."""
    try:
        text = path.read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return []
    reports = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
            value = float(entry[tag])
            step = int(float(entry.get("global_step") or 0))
        except (ValueError, KeyError, TypeError):
            continue
        if math.isfinite(value):
            reports.append((step, value))
    return reports


# -- the loop ---------------------------------------------------------------------------------


@dataclass
class RunningTrial:
    record: HyperparameterOutput
    metrics_dir: Path
    reports_seen: int = 0
    stopped_early: bool = False


class Study:
    """Runs a tuning job's trials with the supervisor's machinery."""

    def __init__(self, supervisor):
        from aiptrain.search import Search

        self.sup = supervisor
        self.store = supervisor.store
        self.job_id = supervisor.job_id
        job = self.store.get(self.job_id)
        self.spec: HyperparameterSpec = job.training_input.hyperparameters
        self.replicas = replicas_for(job.training_input)
        self.expected = [r.task_name for r in self.replicas]
        self.work_dir = supervisor.settings.job_work_dir(self.job_id)
        self.inputs = load_plan_inputs(self.work_dir)
        self.search = Search(self.spec, seed=STUDY_SEED)
        self.output = job.training_output or TrainingOutput()
        self.output.is_hyperparameter_tuning_job = True
        self.output.hyperparameter_metric_tag = self.spec.metric_tag
        self.output.trials = self.output.trials or []
        self.running: dict[str, RunningTrial] = {}
        self.exhausted = False
        self._resume(job)

    def _resume(self, job: Job) -> None:
        """Seed the search with a previous job's trials (resumePreviousJobId) and with this
        job's own, when a new supervisor takes the study over."""
        if self.spec.resume_previous_job_id:
            previous = self.store.get(self.spec.resume_previous_job_id)
            if previous and previous.training_output and previous.training_output.trials:
                self.search.add_history(previous.training_output.trials)
        self.search.restore(self.output.trials)
        for record in self.output.trials:
            if record.state is State.RUNNING:
                self.running[record.trial_id] = RunningTrial(record, self._metrics_dir(record.trial_id))

    # -- counting -------------------------------------------------------------------------

    def counts(self) -> StudyCounts:
        trials = self.output.trials
        budget = self.search.trial_budget
        if self.exhausted:
            budget = len(trials)
        return StudyCounts(
            budget=budget,
            started=len(trials),
            running=len(self.running),
            succeeded=sum(1 for t in trials if t.state is State.SUCCEEDED),
            failed=sum(1 for t in trials if t.state is State.FAILED),
        )

    def save(self) -> None:
        self.output.completed_trial_count = sum(1 for t in self.output.trials if t.state is State.SUCCEEDED)
        self.store.set_training_output(self.job_id, self.output)

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> State:
        from aiptrain.supervisor import Settle
        from aiptrain.validation import scheduling_seconds

        settle = Settle()
        self.save()
        while True:
            job = self.store.get(self.job_id)
            if self.sup.ran_too_long(job, scheduling_seconds(job, "max_running_time")):
                continue
            if job.state is State.CANCELLING:
                return self.end_study(Decision(State.CANCELLED), State.CANCELLED)
            observations = self.sup.observe()
            for trial_id in list(self.running):
                group = [o for o in observations if o.trial_id == trial_id]
                self.step_trial(self.running[trial_id], group, job.state)
            if self.store.get(self.job_id).state is State.CANCELLING:
                continue  # a cancel came while trials were being looked at
            step = schedule(self.counts(), self.spec.parallel_limit, self.spec.max_failed_trials)
            if step.end is not None:
                return self.end_study(Decision(step.end, self.failure(step)), step.end)
            for _ in range(step.start):
                if not self.start_trial():
                    break
            self.sup.wait(settle)

    def failure(self, step: StudyStep) -> str | None:
        if step.end is not State.FAILED:
            return None
        failed = [t.trial_id for t in self.output.trials if t.state is State.FAILED]
        named = f" Failed trials: {', '.join(failed)}." if failed else ""
        return f"The hyperparameter tuning job failed: {step.reason}{named}"

    def start_trial(self) -> bool:
        """Ask the search for the next point and launch it; False when the space is exhausted."""
        trial_id = str(len(self.output.trials) + 1)
        values = self.search.suggest(trial_id)
        if values is None:
            self.exhausted = True
            return False
        record = HyperparameterOutput(
            trial_id=trial_id, hyperparameters=values, state=State.RUNNING, start_time=utc_now()
        )
        self.output.trials.append(record)
        self.save()  # recorded before anything exists, so a successor supervisor knows it
        running = RunningTrial(record, self._metrics_dir(trial_id))
        self.running[trial_id] = running
        shown = " ".join(f"--{k}={v}" for k, v in values.items())
        self.sup.writer.service(f"Starting trial {trial_id}: {shown}", trial=trial_id)
        try:
            self._prepare_dirs(running)
            job = self.store.get(self.job_id)
            trial = Trial(trial_id, values, str(running.metrics_dir))
            self.sup.backend.launch(plan(job, self.replicas, self.inputs, trial))
        except AiptrainError as exc:
            self.sup.writer.service(f"Trial {trial_id} could not start: {exc}", "ERROR", trial_id)
            self.end_trial(running, State.FAILED)
        return True

    def _metrics_dir(self, trial_id: str) -> Path:
        return self.work_dir / "trials" / trial_id

    def _prepare_dirs(self, running: RunningTrial) -> None:
        """The trial's metric directory, and its job dir (`<jobDir>/<trialId>`) when the job dir
        is local, both writable by the replicas' user."""
        dirs = [running.metrics_dir]
        if self.inputs.job_dir_mount:
            dirs.append(Path(self.inputs.job_dir_mount) / running.record.trial_id)
        uid, gid = (int(part) for part in self.inputs.user.split(":"))
        for path in dirs:
            path.mkdir(parents=True, exist_ok=True)
            if os.getuid() == 0:
                os.chown(path, uid, gid)

    def step_trial(self, running: RunningTrial, group: list, state_seen: State) -> None:
        trial_id = running.record.trial_id
        decision = self.sup.step_group(self.expected, group, state_seen, trial_id)
        if decision.state is State.CANCELLED:
            return  # the study loop sees the cancel and ends every trial
        if decision.state is None and self.should_stop_early(running):
            self.sup.writer.service(f"Trial {trial_id} stopped early: its metric trails the other trials.",
                                    trial=trial_id)
            running.stopped_early = True
            decision = Decision(State.SUCCEEDED)
        if decision.state is None:
            return
        self.sup.end_group(group, trial_id)
        if decision.state is State.FAILED:
            message = self.sup.error_message(decision, trial_id)
            self.sup.writer.service(f"Trial {trial_id} failed. {message}", "ERROR", trial_id)
        self.end_trial(running, decision.state)

    def should_stop_early(self, running: RunningTrial) -> bool:
        """Feed the trial's new intermediate reports to the search's pruner."""
        reports = read_metrics(running.metrics_dir / Trial.metric_file(PRIMARY_TASK), self.spec.metric_tag)
        new, running.reports_seen = reports[running.reports_seen:], len(reports)
        stop = False
        for step, value in new:
            stop = self.search.report(running.record.trial_id, step, value) or stop
        return stop

    def end_trial(self, running: RunningTrial, state: State) -> None:
        """Record how the trial ended, with its final metric: the last report under the tag."""
        record = running.record
        reports = read_metrics(running.metrics_dir / Trial.metric_file(PRIMARY_TASK), self.spec.metric_tag)
        if reports and state is State.SUCCEEDED:
            step, value = reports[-1]
            record.final_metric = Metric(training_step=step, objective_value=value)
        elif state is State.SUCCEEDED:
            self.sup.writer.service(
                f"Trial {record.trial_id} reported no metric under [{self.spec.metric_tag}]: report it with "
                "cloudml-hypertune's report_hyperparameter_tuning_metric.", "WARNING", record.trial_id
            )
        record.state = state
        record.end_time = utc_now()
        if running.stopped_early:
            record.is_trial_stopped_early = True
        if record.final_metric:
            metric = record.final_metric
            self.sup.writer.service(
                f"Trial {record.trial_id} finished: {self.spec.metric_tag} = {metric.objective_value} "
                f"at step {metric.training_step}.", trial=record.trial_id,
            )
        objective = record.final_metric.objective_value if record.final_metric else None
        self.search.complete(record.trial_id, objective, state, running.stopped_early)
        self.running.pop(record.trial_id, None)
        self.save()

    def end_study(self, decision: Decision, trials_end_as: State) -> State:
        """Stop every trial still running (as CANCELLED, or FAILED when the study failed),
        then end the job through the supervisor."""
        observations = self.sup.observe()
        for trial_id, running in list(self.running.items()):
            self.sup.end_group([o for o in observations if o.trial_id == trial_id], trial_id)
            self.end_trial(running, State.CANCELLED if trials_end_as is not State.SUCCEEDED else trials_end_as)
        self.save()
        shutil.rmtree(self.work_dir / "trials", ignore_errors=True)
        return self.sup.finish(decision, [])

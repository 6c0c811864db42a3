"""A tuning job's study, stepped by its JobDriver: trials are groups of the job's replicas.

Each trial is the job's whole replica topology, planned with the trial's values
(`planning.plan(..., trial=...)`), launched on the same backend and driven by the same per-group
steps as a plain job (restarts, lifecycle.decide, log following, GroupEnding). `tuning.schedule()`
is the one rule for the study itself: how many trials to start now (up to maxParallelTrials, or
as many as the machine runs at once when fewer: aiptrain.admission.trials_at_once), and when it
is over. The search (which values a trial gets) is aiptrain.search, on optuna.

Every trial is recorded in the job's trainingOutput before its replicas start, and again when it
ends, so a controller that dies mid-study is followed by one that adopts the trials still running
and never loses a finished one.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from aiptrain import safe_files
from aiptrain.admission import trials_at_once, trials_held
from aiptrain.errors import AiptrainError, ValidationError
from aiptrain.lifecycle import Decision
from aiptrain.model import HyperparameterOutput, HyperparameterSpec, Job, Metric, State, TrainingOutput, utc_now
from aiptrain.planning import PlanInputs, StudyRules, Trial, load_plan_inputs, plan, trial_job_dir
from aiptrain.replicas import ReplicaObservation, ReplicaStatus
from aiptrain.runner.groups import DRAIN_LOOK_SECONDS, GroupEnding, Groups
from aiptrain.storage import local_gcs_path
from aiptrain.topology import MASTER_TASK, replicas_for
from aiptrain.trial_metrics import read_hypertune, read_summary_events
from aiptrain.tuning import StudyCounts, StudyStep, final_report, sampler_seed, schedule, stop_now


@dataclass
class RunningTrial:
    record: HyperparameterOutput
    metrics_dir: Path
    launched: bool = True  # False: recorded, but a controller died before its replicas all started
    reports_seen: int = 0
    condemned_at: int | None = None  # reports seen when the pruner said to stop it
    stopped_early: bool = False
    warned: bool = False  # about a metric file it could not read


def _job_dir_on_host(job_dir: str | None, inputs: PlanInputs) -> Path | None:
    """Where the job dir's files are on this host, for reading trials' summary events: the
    local job dir, or a gs:// one kept on this machine that the storage endpoint serves."""
    if inputs.job_dir_mount:
        return Path(inputs.job_dir_mount)
    if job_dir and inputs.gcs_root and inputs.gcs_endpoint and job_dir.startswith("gs://"):
        try:
            return local_gcs_path(Path(inputs.gcs_root), job_dir)
        except ValidationError:
            return None
    return None


class Study:
    """Runs a tuning job's trials on the job's replica groups (the machinery its driver uses for
    a plain job's replicas); `step` hands the study's end back to the driver as a Decision."""

    def __init__(self, groups: Groups):
        # optuna (0.6 s here) for tuning jobs only; imported under the driver's STUDY_IMPORT lock.
        from aiptrain.search import Search  # noqa: PLC0415

        self.groups = groups
        self.store = groups.store
        self.job_id = groups.job_id
        job = self.store.require(self.job_id)
        assert job.training_input.hyperparameters is not None  # a study runs tuning jobs only
        self.spec: HyperparameterSpec = job.training_input.hyperparameters
        self.replicas = replicas_for(job.training_input)
        self.expected = [r.task_name for r in self.replicas]
        self.paths = groups.settings.job_paths(self.job_id)
        self.inputs = load_plan_inputs(self.paths.plan_inputs)
        self.job_dir = job.training_input.job_dir
        self.job_dir_on_host = _job_dir_on_host(job.training_input.job_dir, self.inputs)
        self.output = job.training_output or TrainingOutput()
        self.output.is_hyperparameter_tuning_job = True
        self.output.hyperparameter_metric_tag = self.spec.metric_tag
        self.output.trials = self.trials = self.output.trials or []  # the same list: saved with the output
        history = self._history()
        self.rules = (self.inputs.contract.study if self.inputs.contract else None) or StudyRules()
        self.search = Search(self.spec, seed=sampler_seed(len(history) + len(self.trials)), rules=self.rules)
        self.running: dict[str, RunningTrial] = {}
        self.endings: dict[str, tuple[GroupEnding, Decision]] = {}  # trials being torn down
        self.closing: tuple[Decision, State] | None = None  # the study's end, once decided
        self.exhausted = False
        self.at_once = self._trials_at_once()
        self._resume(history)
        self.save()

    def _trials_at_once(self) -> int:
        """How many trials run at once: as many as the replicas admission holds for the study
        (counted at submit: maxParallelTrials, or fewer where the machine runs fewer), so the study
        never runs more than it was admitted for; trials beyond it start as earlier ones end."""
        asked = min(self.spec.parallel_limit, self.spec.trials_limit)
        held = self.store.held_replicas(self.job_id)
        if held is None:  # not counted by admission (it always is once admitted): this machine's bound
            settings = self.groups.settings
            return trials_at_once(self.spec, len(self.replicas), os.cpu_count() or 1,
                                  settings.max_running_replicas).trials
        return trials_held(held, len(self.replicas), asked)

    def _history(self) -> list[HyperparameterOutput]:
        """A previous job's trials (resumePreviousJobId)."""
        if not self.spec.resume_previous_job_id:
            return []
        key = self.store.key_of(self.store.project_of(self.job_id), self.spec.resume_previous_job_id)
        previous = self.store.get(key) if key else None
        return list(previous.training_output.trials or []) if previous and previous.training_output else []

    def _resume(self, history: list[HyperparameterOutput]) -> None:
        """Inform the search of a previous job's trials and of this job's own, when a new
        controller takes the study over (the sampler's state is rebuilt from them)."""
        self.search.add_history(history)
        self.search.restore(self.trials)
        for record in self.trials:
            if record.state is State.RUNNING:
                self.running[record.trial_id] = RunningTrial(record, self.paths.trial_dir(record.trial_id),
                                                             launched=self._launch_recorded(record.trial_id))

    # -- counting -------------------------------------------------------------------------

    def counts(self) -> StudyCounts:
        trials = self.trials
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
        self.output.completed_trial_count = sum(1 for t in self.trials if t.state is State.SUCCEEDED)
        self.store.set_training_output(self.job_id, self.output)

    # -- the loop -------------------------------------------------------------------------

    def step(self, job: Job) -> float | Decision:
        """One look at every trial: step those running or ending, then start or end per
        tuning.schedule. Seconds until the next look, or, once every trial is gone, the job's
        end for its driver to carry out."""
        if self.closing is not None:
            return self.step_closing()
        if job.state is State.CANCELLING:
            return self.close(Decision(State.CANCELLED), State.CANCELLED) or 0
        observations = self.groups.observe()
        for trial_id in list(self.running):
            group = [o for o in observations if o.trial_id == trial_id]
            if trial_id in self.endings:
                self.step_ending(trial_id)
            elif not self.running[trial_id].launched:
                self.finish_launch(self.running[trial_id], group)
            else:
                self.step_trial(self.running[trial_id], group, job.state)
        if self.groups.cancelling():
            return 0  # a cancel came while trials were being looked at
        step = schedule(self.counts(), self.at_once, self.spec.max_failed_trials)
        if step.end is not None:
            return self.close(Decision(step.end, self.failure(step)), step.end) or 0
        for _ in range(step.start):
            if not self.start_trial():
                break
        return self.next_look()

    def next_look(self) -> float:
        """Soon while a trial's logs drain; at the poll otherwise (engine events wake us sooner)."""
        draining = any(not ending.awaited for ending, _ in self.endings.values())
        return DRAIN_LOOK_SECONDS if draining else self.groups.settings.poll_seconds

    def failure(self, step: StudyStep) -> str | None:
        if step.end is not State.FAILED:
            return None
        failed = [t.trial_id for t in self.trials if t.state is State.FAILED]
        named = f" Failed trials: {', '.join(failed)}." if failed else ""
        return f"The hyperparameter tuning job failed: {step.reason}{named}"

    def start_trial(self) -> bool:
        """Ask the search for the next point and launch it; False when the space is exhausted."""
        trial_id = str(len(self.trials) + 1)
        values = self.search.suggest(trial_id)
        if values is None:
            self.exhausted = True
            return False
        record = HyperparameterOutput(
            trial_id=trial_id, hyperparameters=values, state=State.RUNNING, start_time=utc_now()
        )
        self.trials.append(record)
        self.save()  # recorded before anything exists, so a successor controller knows it
        running = RunningTrial(record, self.paths.trial_dir(trial_id), launched=False)
        self.running[trial_id] = running
        shown = " ".join(f"--{k}={v}" for k, v in values.items())
        self.groups.writer.service(f"Starting trial {trial_id}: {shown}", trial=trial_id)
        self.launch(running)
        return True

    def launch(self, running: RunningTrial) -> None:
        """Start the trial's replicas, then record that its launch completed: a successor finds
        a trial without that record half-launched (see finish_launch)."""
        trial_id = running.record.trial_id
        try:
            self._prepare_dirs(running)
            job = self.store.require(self.job_id)
            trial = Trial(trial_id, running.record.hyperparameters, str(running.metrics_dir))
            self.groups.backend.launch(plan(job, self.replicas, self.inputs, trial, key=self.job_id))
        except AiptrainError as exc:
            self.groups.writer.service(f"Trial {trial_id} could not start: {exc}", "ERROR", trial_id)
            self.end_trial(running, State.FAILED)
            return
        self._record_launch(running)

    def _record_launch(self, running: RunningTrial) -> None:
        """The trial's launch completed: its marker, which a successor controller goes by."""
        marker = self.paths.launched(running.record.trial_id)
        safe_files.make_dirs(self.paths.work_dir, marker.parent.relative_to(self.paths.work_dir))
        marker.touch()
        running.launched = True

    def _launch_recorded(self, trial_id: str) -> bool:
        return self.paths.launched(trial_id).is_file()

    def finish_launch(self, running: RunningTrial, group: list[ReplicaObservation]) -> None:
        """A trial a killed controller recorded but did not finish launching. Replicas created
        but never started (Docker's `Created`) are not running, so they are started. They are
        never replaced while every replica exists: a start the killed controller sent may reach
        the engine after this look, and a replaced replica would then have run too, where the
        engine starts an existing one once. With replicas missing and none started, what exists
        is replaced by a new launch of the same values."""
        trial_id = running.record.trial_id
        started = [o for o in group if o.status is not ReplicaStatus.CREATED]
        if not started:
            self.groups.writer.service(f"Trial {trial_id} was not started when its controller stopped: starting it.",
                                       trial=trial_id)
            if not set(self.expected) <= {o.task_name for o in group}:
                self.groups.backend.remove(self.job_id, trial_id)
                self.launch(running)
                return
        for observation in group:
            if observation.status is ReplicaStatus.CREATED:
                self.groups.backend.restart(observation.container_id or "")
        self._record_launch(running)

    def _prepare_dirs(self, running: RunningTrial) -> None:
        """The trial's metric directory, and its job dir (`<jobDir>/<trialId>`) when the job dir
        is local, both writable by the replicas' user. Earlier trials wrote in the job dir: a
        link they left at `<trialId>` is refused, never followed (aiptrain.safe_files)."""
        uid, gid = (int(part) for part in self.inputs.user.split(":"))
        owner = (uid, gid) if os.getuid() == 0 else None
        safe_files.make_dirs(self.paths.work_dir, running.metrics_dir.relative_to(self.paths.work_dir), owner)
        if self.inputs.job_dir_mount:
            safe_files.make_dirs(Path(self.inputs.job_dir_mount), running.record.trial_id, owner)

    def step_trial(self, running: RunningTrial, group: list[ReplicaObservation], state_seen: State | None) -> None:
        trial_id = running.record.trial_id
        decision = self.groups.step_group(self.expected, group, state_seen, trial_id)
        if decision.state is State.CANCELLED:
            return  # the study loop sees the cancel and ends every trial
        if decision.state is None and self.spec.early_stopping and self.should_stop_early(running):
            self.groups.writer.service(f"Trial {trial_id} stopped early: its metric trails the other trials.",
                                    trial=trial_id)
            running.stopped_early = True
            decision = Decision(State.SUCCEEDED)
        if decision.state is None:
            return
        self.endings[trial_id] = (GroupEnding(self.groups, group, trial_id), decision)
        self.step_ending(trial_id)

    def step_ending(self, trial_id: str) -> None:
        """One step of a trial's teardown; once its group is gone, record how it ended."""
        ending, decision = self.endings[trial_id]
        if not ending.step():
            return
        del self.endings[trial_id]
        if decision.state is State.FAILED:
            message = self.groups.error_message(decision, trial_id)
            self.groups.writer.service(f"Trial {trial_id} failed. {message}", "ERROR", trial_id)
        self.end_trial(self.running[trial_id], decision.state or State.FAILED)

    def should_stop_early(self, running: RunningTrial) -> bool:
        """Feed the trial's new intermediate reports to the search's pruner; True once the pruner
        condemned the trial and it reported again (see stop_now)."""
        reports = self.reports(running)
        new, seen = reports[running.reports_seen:], running.reports_seen
        running.reports_seen = max(len(reports), seen)
        for offset, (step, value) in enumerate(new, start=1):
            if self.search.report(running.record.trial_id, step, value) and running.condemned_at is None:
                running.condemned_at = seen + offset
        return stop_now(running.condemned_at, running.reports_seen)

    def reports(self, running: RunningTrial) -> list[tuple[int, float]]:
        """The trial's reports under the metric tag: its primary replica's cloudml-hypertune
        file, else the TensorFlow summary events under its job dir (`<jobDir>/<trialId>`)."""
        trial_id, tag = running.record.trial_id, self.spec.metric_tag
        try:
            # The master's reports are the trial's metric, as on the service.
            metric_file = self.paths.metric_file(trial_id, MASTER_TASK)
            reports = read_hypertune(metric_file.parent, metric_file.name, tag)
        except (safe_files.UnsafePath, OSError) as exc:
            if not running.warned:
                self.groups.writer.service(f"Trial {trial_id}'s metric file is not read: {exc}", "WARNING", trial_id)
                running.warned = True
            reports = []
        if not reports and self.job_dir_on_host:
            reports = read_summary_events(self.job_dir_on_host, trial_id, tag)
        return reports

    def end_trial(self, running: RunningTrial, state: State) -> None:
        """Record how the trial ended, with its final metric: the last report under the tag (or
        the best, where the study's rules say so)."""
        record = running.record
        reports = self.reports(running) if state is State.SUCCEEDED else []
        if reports:
            step, value = final_report(reports, self.spec.effective_goal, self.rules.best_report_is_final)
            record.final_metric = Metric(training_step=step, objective_value=value)
        elif state is State.SUCCEEDED:
            self.groups.writer.service(
                f"Trial {record.trial_id} reported no metric under [{self.spec.metric_tag}]: report it with "
                "cloudml-hypertune's report_hyperparameter_tuning_metric, or as a TensorFlow summary scalar "
                "in its job dir.", "WARNING", record.trial_id
            )
        record.state = state
        record.end_time = utc_now()
        built_in = self.output.built_in_algorithm_output
        if built_in is not None and state is State.SUCCEEDED:  # its model, in the trial's job dir
            record.built_in_algorithm_output = built_in.succeeded_in(
                trial_job_dir(self.job_dir, Trial(record.trial_id, {})) if self.job_dir else None)
        if running.stopped_early:
            record.is_trial_stopped_early = True
        if record.final_metric:
            metric = record.final_metric
            self.groups.writer.service(
                f"Trial {record.trial_id} finished: {self.spec.metric_tag} = {metric.objective_value} "
                f"at step {metric.training_step}.", trial=record.trial_id,
            )
        objective = record.final_metric.objective_value if record.final_metric else None
        self.search.complete(record.trial_id, objective, state, running.stopped_early)
        self.running.pop(record.trial_id, None)
        self.save()

    def close(self, decision: Decision, trials_end_as: State) -> Decision | None:
        """The study is over: every trial still running ends (CANCELLED, or as the study when it
        failed); the job's end once they all are gone (now, or at a later step_closing)."""
        self.closing = (decision, State.CANCELLED if trials_end_as is not State.SUCCEEDED else trials_end_as)
        observations = self.groups.observe()
        for trial_id in self.running:
            if trial_id not in self.endings:
                group = [o for o in observations if o.trial_id == trial_id]
                self.endings[trial_id] = (GroupEnding(self.groups, group, trial_id), Decision(self.closing[1]))
        ended = self.step_closing()
        return ended if isinstance(ended, Decision) else None

    def step_closing(self) -> float | Decision:
        assert self.closing is not None  # set by close()
        for trial_id in list(self.endings):
            self.step_ending(trial_id)
        if self.endings:
            return self.next_look()
        self.save()
        shutil.rmtree(self.paths.trials_dir, ignore_errors=True)
        return self.closing[0]

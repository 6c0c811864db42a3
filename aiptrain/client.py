"""The Python API, and the one façade every job verb goes through (the CLI included):
a `Client` holds the settings, the store and the backend, and offers submit, get, list,
cancel, wait, stream_logs and update_labels, returning the pydantic `Job` the CLI prints.

    import aiptrain

    with aiptrain.Client() as client:
        job = client.submit_training("run_1", package_path="trainer", module_name="trainer.task",
                                     job_dir="/tmp/run_1", args=["--steps", "100"])
        for line in client.stream_logs(job.job_id):
            print(line)
        print(client.wait(job.job_id).state)
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property
from pathlib import Path

from aiptrain import jobs, listing, logs
from aiptrain.backends import Backend, open_backend
from aiptrain.config import SubmitFlags
from aiptrain.errors import EnvironmentNotReady, JobNotFound, ValidationError
from aiptrain.exports import dry_run_tfjob, dry_run_trainjob, tfjob_export, trainjob_export
from aiptrain.jobkeys import JobKey
from aiptrain.model import Job
from aiptrain.planning import ReplicaContract, load_contract
from aiptrain.remote import ApiClient
from aiptrain.replicas import ReplicaObservation
from aiptrain.service import JobService, LabelsUpdate
from aiptrain.settings import Settings
from aiptrain.store import JobStore
from aiptrain.submission import Submission, Submitter, check_buckets, prepare
from aiptrain.tfjob import Export
from aiptrain.trainjob import Runtime, TrainJobExport
from aiptrain.validation import check_label_count, validate_labels

SUBMIT_FLAG_NAMES = frozenset(f.name for f in dataclasses.fields(SubmitFlags))


def open_client(settings: Settings | None = None, project: str | None = None) -> JobService:
    """The façade the settings choose: this installation (`Client`), or in client mode
    (AIPTRAIN_API set) the one behind that `aiptrain serve` (aiptrain.remote.ApiClient, whose
    jobs live in `project`). Both are a JobService (aiptrain.service): mypy checks it here."""
    settings = settings or Settings()
    if settings.api_url:
        return ApiClient(settings, project)
    return Client(settings=settings, project=project)


class Client:
    """One aiptrain installation (AIPTRAIN_HOME, or `home`): the jobs of one of its projects
    (`project`, default: the installation's default project, CLOUDSDK_CORE_PROJECT else
    `aiptrain`), and its engine. Job IDs are unique per project: every verb finds the job of
    that ID in this project only. The store and the engine are opened on first use; `close()`
    (or `with`) releases them."""

    def __init__(self, home: str | Path | None = None, settings: Settings | None = None,
                 backend: Backend | None = None, project: str | None = None, store: JobStore | None = None):
        if settings is None:
            settings = Settings(home=Path(home).expanduser().resolve()) if home else Settings()
        self.settings = settings
        self.project = project or settings.default_project
        self._given_backend = backend  # a given backend (a fake in tests) runs every job
        self._backends: dict[str, Backend] = {}
        if store is not None:  # an open store the caller keeps (aiptrain serve's threads): never closed here
            self.__dict__["store"] = store
        self._owns_store = store is None

    # -- what the client holds ---------------------------------------------------------------

    @cached_property
    def store(self) -> JobStore:
        self.settings.ensure_dirs()
        return JobStore.of(self.settings)

    def backend_named(self, name: str | None = None) -> Backend:
        """The backend called `name` (default: the settings'), opened once per client."""
        if self._given_backend is not None:
            return self._given_backend
        name = name or self.settings.backend
        if name not in self._backends:
            self._backends[name] = open_backend(self.settings, name)
        return self._backends[name]

    def backend_for(self, key: str) -> Backend:
        """The backend the job (by its key) was submitted to."""
        return self.backend_named(self.store.backend_of(key))

    def key(self, job_id: str) -> JobKey:
        """The key of this project's job `job_id` (aiptrain.jobkeys); JobNotFound if it has none."""
        return jobs.find_key(self.project, job_id, self.settings, self.store)

    def close(self) -> None:
        if "store" in self.__dict__ and self._owns_store:
            self.store.close()
            del self.__dict__["store"]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- submit ----------------------------------------------------------------------------

    def prepare(self, flags: SubmitFlags, base: Job | None = None,
                previous_job: Callable[[str], Job | None] | None = None) -> Submission:
        """Check a submission without side effects (what `--dry-run` shows); `base` is a Job
        resource (a REST create's body) the flags apply to, as to a --config file. A resumed
        study's previous job is read with `previous_job` (default: from this store)."""
        return prepare(flags, self.settings, base, previous_job or self._stored_job)

    def _stored_job(self, job_id: str) -> Job | None:
        """The job, or None; a home with no store yet is left without one (a dry run makes none)."""
        if not self.settings.store_url and not self.settings.store_path.exists():
            return None
        key = self.store.key_of(self.project, job_id)
        return self.store.get(key) if key else None

    def submit(self, submission: Submission, report: Callable[[str], None] | None = None,
               build_progress: Callable[[str], None] | None = None) -> Job:
        """Run a prepared submission; `report` hears each step. A runtime image the engine lacks
        is built first (`build_progress` hears that build) unless AIPTRAIN_AUTO_BUILD=0. A
        submission without a project is made in this client's. Returns once the replicas run."""
        return self._submit(submission, report, build_progress, wait=True)

    def queue(self, submission: Submission) -> Job:
        """What the REST API's create does, as the service did: the job validated, staged and
        recorded, answered as queued; its launch is the controller's, and a launch the engine
        refuses ends the job FAILED with the engine's words (a client's 60 s timeout never
        waits on the engine)."""
        return self._submit(submission, None, None, wait=False)

    def _submit(self, submission: Submission, report: Callable[[str], None] | None,
                build_progress: Callable[[str], None] | None, wait: bool) -> Job:
        if submission.project is None:
            submission = dataclasses.replace(submission, project=self.project)
        check_buckets(submission, self.settings)
        full = self.settings.out_of_space()
        if full:  # refused before the store, the log or the bucket is touched
            raise EnvironmentNotReady(full)
        build_progress = (build_progress or report or (lambda line: None)) if self.settings.auto_build else None
        return Submitter(self.settings, self.store, self.backend_named(submission.backend), report,
                         build_progress).submit(submission, wait)

    def submit_training(
        self,
        job_id: str,
        package_path: str | Path | None = None,
        module_name: str | None = None,
        job_dir: str | Path | None = None,
        config: str | Path | None = None,
        args: Iterable[str] = (),
        **flags,
    ) -> Job:
        """`jobs submit training`: keyword arguments are its flags in snake_case
        (region, scale_tier, runtime_version, labels={...}, packages=[...], master_image_uri, ...)."""
        unknown = sorted(set(flags) - SUBMIT_FLAG_NAMES)
        if unknown:
            raise ValidationError(f"submit_training() got unknown flag(s) {', '.join(unknown)}: use the snake_case "
                                  "names of `jobs submit training`'s flags.")
        submit_flags = SubmitFlags(
            job_id=job_id, package_path=_text(package_path), module_name=module_name, job_dir=_text(job_dir),
            config=_text(config), user_args=list(args), **flags,
        )
        return self.submit(self.prepare(submit_flags))

    def dry_run_tfjob(self, submission: Submission) -> Export:
        """The Kubeflow TFJob of a prepared submission, its packages where submit would stage them."""
        return dry_run_tfjob(submission, self.settings)

    def export_tfjob(self, job_id: str) -> Export:
        """A submitted job as a Kubeflow TFJob (`jobs export --format tfjob`); `.tfjob.to_manifest()`
        is the manifest, `.comment()` and `.warnings` what to tell the person applying it."""
        job = self.get(job_id)
        return tfjob_export(job, list(job.training_input.package_uris or []), self.settings, self._contract(job_id))

    def dry_run_trainjob(self, submission: Submission, runtime: Runtime | None = None) -> TrainJobExport:
        """The Kubeflow Trainer v2 TrainJob (and runtime) of a prepared submission; `runtime`
        None: the one the job's shape calls for."""
        return dry_run_trainjob(submission, self.settings, runtime or Runtime.AUTO)

    def export_trainjob(self, job_id: str, runtime: Runtime | None = None) -> TrainJobExport:
        """A submitted job as a Kubeflow Trainer v2 TrainJob and the runtime it references (`jobs
        export`); `.documents()` are the manifests in order, `.comment()` and `.warnings` what to
        tell the person applying them."""
        job = self.get(job_id)
        return trainjob_export(job, list(job.training_input.package_uris or []), self.settings, runtime or Runtime.AUTO,
                               self._contract(job_id))

    def _contract(self, job_id: str) -> ReplicaContract | None:
        """What the job told its replicas beyond AI Platform's rules (a Vertex AI job's), as its submit kept it."""
        return load_contract(self.settings.job_paths(self.key(job_id)).contract)

    # -- read ------------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        """The job; JobNotFound if this project has none."""
        return jobs.get_job(self.key(job_id), self.settings, self.store)

    def list_resources(self, filter: str | None = None, sort_by: str | Iterable[str] | None = None,
                       limit: int | None = None, fields: Iterable[str] | None = None) -> list[dict]:
        """`list` as REST resources (dicts), only `fields` of each when given."""
        return listing.list_resources(self.settings, filter, sort_by, limit, fields, table=self.store,
                                      project=self.project)

    # Below this method, `list` in the class's annotations means it: the type is builtins.list.
    def list(self, filter: str | None = None, sort_by: str | Iterable[str] | None = None,
             limit: int | None = None) -> list[Job]:
        """Jobs as `jobs list` selects them: gcloud's --filter expression and --sort-by keys
        (`~` for descending; newest first by default), sorted, then filtered, then limited."""
        found = listing.list_resources(self.settings, filter, sort_by, limit, table=self.store, project=self.project)
        return [Job.model_validate(resource) for resource in found]

    @property
    def local_gcs_root(self) -> Path:
        """Where this machine keeps gs:// paths when Cloud Storage is not used."""
        return self.settings.gcs_root

    def job_ids(self, prefix: str = "") -> builtins.list[str]:
        """IDs starting with `prefix`, newest first (shell completion)."""
        return self.store.job_ids(self.project, prefix)

    def waiting_reason(self, job_id: str) -> str | None:
        """Why a QUEUED job has not started yet (aiptrain.admission); None when it does not wait."""
        queued = self.store.queue_position(self.key(job_id))
        return queued[1] if queued else None

    def uri(self, job_id: str, project: str | None = None) -> str:
        """The job's REST URI, as `jobs list --uri` prints it: in `project`, else this client's."""
        project = project or self.project
        return f"https://ml.googleapis.com/v1/projects/{project}/jobs/{job_id}"

    # -- wait, logs, cancel ----------------------------------------------------------------

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job ends (or `timeout` seconds pass); the job as it then is."""
        return jobs.wait_until_done(self.key(job_id), self.settings, self.store, timeout)

    def log_batches(self, job_id: str, task_name: str | None = None, poll_seconds: float = 0.2,
                    on_poll: Callable[[Job], None] | None = None) -> Iterator[builtins.list[logs.LogRecord]]:
        """The job's log records in batches as they are written, until the job has ended;
        `on_poll` sees the job each time it is looked at."""
        key = self.key(job_id)
        return logs.follow(self.settings.job_paths(key).log, self._ended(key, on_poll), poll_seconds, task=task_name)

    def log_blocks(self, job_id: str, poll_seconds: float = 0.2) -> Iterator[bytes]:
        """log_batches' lines unparsed (JSON lines, whole ones), for `logs.format_lines`: what
        printing a million lines costs is mostly building a record for each."""
        key = self.key(job_id)
        return logs.follow_blocks(self.settings.job_paths(key).log, self._ended(key), poll_seconds)

    def _ended(self, key: JobKey, on_poll: Callable[[Job], None] | None = None) -> Callable[[], bool]:
        jobs.get_job(key, self.settings, self.store)  # driven.

        def ended() -> bool:
            job = jobs.get_job(key, self.settings, self.store)
            if on_poll:
                on_poll(job)
            return job.state is not None and job.state.is_terminal

        return ended

    def stream_logs(self, job_id: str, task_name: str | None = None,
                    poll_seconds: float = 0.2) -> Iterator[logs.LogRecord]:
        """The job's log records (time, task, severity, message, trial), following until it ends;
        `logs.format_record(record)` gives gcloud's lines."""
        for batch in self.log_batches(job_id, task_name, poll_seconds):
            yield from batch

    def replicas(self, job_id: str) -> builtins.list[ReplicaObservation]:
        """What the engine says about the job's replicas now (backends.ReplicaObservation)."""
        key = self.key(job_id)
        return self.backend_for(key).observe(key)

    def restart_counts(self, job_id: str) -> dict[str, int]:
        """Restarts so far, by task name."""
        return self.store.restarts(self.key(job_id))

    def cancel(self, job_id: str, timeout: float = 60) -> Job:
        """Cancel the job and wait (up to `timeout`) until it has stopped; a job that ended stays as it is."""
        key = self.key(job_id)
        return jobs.cancel(key, self.settings, self.store, self.backend_for(key), timeout)

    # -- labels ----------------------------------------------------------------------------

    def update_labels(self, job_id: str, update: dict[str, str] | None = None,
                      remove: Iterable[str] = (), clear: bool = False) -> LabelsUpdate:
        """`jobs update`: clear, then update, then remove (an absent key is ignored), in one
        compare-and-set on the store; finished jobs too."""
        if update:
            validate_labels(update)
        key = self.key(job_id)  # JobNotFound before anything else

        def change(labels: dict[str, str]) -> dict[str, str]:
            new = {} if clear else dict(labels)
            new.update(update or {})
            for key in remove:
                new.pop(key, None)
            check_label_count(new)
            return new

        job, changed = self.store.update_labels(key, change)
        if job is None:  # deleted since the check above
            raise JobNotFound(job_id)
        return LabelsUpdate(job, changed)


def _text(value: str | Path | None) -> str | None:
    return None if value is None else str(value)

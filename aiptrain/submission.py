"""Submitting a job: check the flags (`prepare`, no side effects), then carry the
submission from package to running replicas (`Submitter`).

Submit order matters for "nothing half-created": every check that needs no side
effect runs first; then the job's lock is taken and its row recorded: the one
reservation of the ID, against concurrent submits (the lock) and jobs that exist
(the row); then the runtime image is looked at (built when missing), and the
package is built and staged; any rejection after that point undoes the row,
staged objects and scratch files before the error is shown. Once replicas start,
the job is real: later failures are recorded on the job, not undone.

Each question is asked once (TorchX's `run = dryrun + schedule`): one reservation,
one inspection of the runtime image (its freshness, its contents, the readiness
check and the install's key all read it), one fetch, one plan
(tests/unit/test_submit_questions.py counts them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiptrain import admission, safe_files, staging, wheelhouse
from aiptrain.algorithms import images as algorithm_images
from aiptrain.algorithms.catalog import Algorithm, algorithm_of, output_of
from aiptrain.backends import Backend, ImageInfo
from aiptrain.config import SubmitFlags, build_job, config_scale_tier, pydantic_error_line
from aiptrain.errors import EnvironmentNotReady, JobExists, ValidationError
from aiptrain.installs import PureTrainer, ensure_installed, install_target
from aiptrain.jobkeys import new_key, qualified_key
from aiptrain.jobpaths import WHEELHOUSE
from aiptrain.labels import LABEL_INSTALL_FOR, LABEL_INSTALLATION
from aiptrain.lifecycle import RunRules
from aiptrain.logs import JobLogWriter
from aiptrain.model import TERMINAL_STATES, Job, ScaleTier, State, TrainingOutput
from aiptrain.ownership import JobLock
from aiptrain.packaging import cached_sdist
from aiptrain.planning import (
    NOBODY_ID,
    PACKAGES_DIR,
    LaunchPlan,
    Mount,
    PlanInputs,
    ReplicaContract,
    gcs_urls_in,
    plan,
    replica_user,
    save_contract,
    save_plan_inputs,
    storage_endpoint_for,
)
from aiptrain.runner import control
from aiptrain.runtime_catalog import Runtime
from aiptrain.runtimes import check_available, ensure_image, image_contents, is_current
from aiptrain.runtimes import lookup as lookup_runtime
from aiptrain.settings import Settings, gcloud_property
from aiptrain.storage import check_gcs_uri, emulator_host, gcs_root_for, is_gcs, local_path, projects
from aiptrain.storage.endpoint import TLS_DIR_NAME, ProjectCredential, StorageEndpoint
from aiptrain.storage.gcs import CONTAINER_CREDENTIALS, replica_access
from aiptrain.storage.local import copy_regular
from aiptrain.storage.projects import make_buckets, project_credential
from aiptrain.store import JobStore, duplicate_job
from aiptrain.topology import Replica, normalize_scale_tier, replicas_for
from aiptrain.validation import (
    check_custom_container,
    check_local_bucket,
    check_package_in_image,
    check_unique_names,
    scheduling_seconds,
    split_packages,
    validate_job_id,
    validate_labels,
    validate_module_name,
    validate_package_path,
)

log = logging.getLogger(__name__)
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
SERVICE_MIN_WAIT_SECONDS = 1800  # the service refuses a shorter scheduling.maxWaitTime
# Submit looks at its job until the controller has launched it: often at first (a BASIC launch
# takes a tenth of a second), then less (each look reads the store, and 8 replicas take seconds
# to start, during which a look every 10 ms was a quarter of a core taken from the engine's starts).
QUICK_LAUNCH_LOOK_SECONDS, QUICK_LAUNCH_SECONDS, LAUNCH_LOOK_SECONDS = 0.01, 0.3, 0.05


@dataclass
class Submission:
    """A validated job and everything submit derived from the flags."""

    job: Job
    replicas: list[Replica]
    package_path: Path | None
    local_packages: list[Path]
    remote_packages: list[str]
    runtime_image: str | None
    job_dir_mount: str | None
    staging_bucket: str | None = None
    limit_resources: bool = False
    installation: str = ""
    gcs_root: Path | None = None  # where gs:// paths are kept on this machine; None: Cloud Storage
    notices: tuple[str, ...] = ()  # one-line warnings for the user, said once at submit
    # Of those, the one that says a study runs fewer trials at once here than maxParallelTrials;
    # the job's log keeps it too.
    trials_notice: str | None = None
    project: str | None = None
    runtime: Runtime | None = None  # what --runtime-version (or runtimeVersion) named
    runtime_given_as: str = "--runtime-version"  # where it was named, for messages
    pids_limit: int | None = None  # processes and threads per replica (AIPTRAIN_REPLICA_PIDS_LIMIT)
    backend: str = "docker"  # what runs the replicas (--backend, AIPTRAIN_BACKEND)
    # gs:// kept on this machine is served to the replicas by the installation's storage endpoint
    # (docker and swarm backends); replicas then see gs:// URLs unchanged, as on the service.
    serves_gcs: bool = False
    # Buckets of other projects the job's replicas may use, (bucket, writable): what a team
    # server's tokens file shares with the job's project (Access.shared_with).
    shared_buckets: tuple[tuple[str, bool], ...] = ()
    # What a job of another dialect (Vertex AI's) tells its replicas (planning.ReplicaContract),
    # and how the controller runs it where that dialect's rules differ (lifecycle.RunRules).
    contract: ReplicaContract | None = None
    # Notices the job's log keeps as well: a REST client never sees `notices`.
    log_notices: tuple[str, ...] = ()
    rules: RunRules | None = None
    # A credentials file the replicas use in place of this host's (a local run's
    # --service-account-key-file): mounted read-only, named by GOOGLE_APPLICATION_CREDENTIALS.
    credentials_file: Path | None = None
    # The built-in algorithm the master's image names (gcr.io/cloud-ml-algos/...): built here when missing.
    algorithm: Algorithm | None = None

    @property
    def writes_remote_gcs(self) -> bool:
        """The job writes to Cloud Storage itself (its job dir, or a contract's output prefix):
        replicas must reach it with this host's credentials."""
        output_dir = self.contract.output_dir if self.contract else None
        places = (self.job.training_input.job_dir, output_dir)
        return self.gcs_root is None and any(place and is_gcs(place) for place in places)


def _local_job_dir(job_dir: str, home: Path) -> str:
    """The job dir's directory on this host, once it is safe to mount read-write into every
    replica: never one that holds the Docker socket or aiptrain's own home (its store, logs and
    other jobs' packages), nor one inside it."""
    path, home = Path(local_path(job_dir)), home.resolve()
    for socket in DOCKER_SOCKETS:
        if Path(socket).resolve().is_relative_to(path):
            raise ValidationError(
                f"--job-dir [{job_dir}] would expose the Docker socket to the replicas: use a dedicated directory."
            )
    if path.is_relative_to(home) or home.is_relative_to(path):
        raise ValidationError(
            f"--job-dir [{job_dir}] would expose aiptrain's home [{home}] (its jobs, logs and packages) to the "
            "replicas: use a directory outside it."
        )
    if path.exists() and not path.is_dir():
        raise ValidationError(f"--job-dir [{job_dir}] exists and is not a directory: choose a directory.")
    return str(path)


PreviousJob = Callable[[str], Job | None]  # a job of the store by ID (None: there is none)


def prepare(flags: SubmitFlags, settings: Settings, base: Job | None = None,
            previous_job: PreviousJob | None = None, runs_here: bool = True) -> Submission:
    """Everything about a submission that can be checked without side effects. `base`: the Job
    resource a REST client sent, in place of a --config file. `previous_job` reads the job a
    resumed study names (resumePreviousJobId), so that its study is taken now (a dry run shows
    it); without it, the submit takes it. `runs_here` False: another machine runs the job
    (remote mode), so this one's size says nothing of it."""
    validate_job_id(flags.job_id)
    job = build_job(flags, base)
    ti = job.training_input
    if job.labels:  # from --labels or from --config: the same rules
        validate_labels(job.labels)
    check_custom_container(ti)
    if not ti.region:
        ti.region = settings.default_region
    notices = [] if base is not None else gcloud_refusals(flags, job)
    if previous_job is not None:
        resume_study(job, previous_job)
    scheduling_seconds(job, "max_running_time")  # malformed: refused here, not when the job runs
    max_wait = scheduling_seconds(job, "max_wait_time")
    if max_wait is not None and ti.scheduling and max_wait < SERVICE_MIN_WAIT_SECONDS:
        notices.append(
            f"scheduling.maxWaitTime [{ti.scheduling.max_wait_time}] is below the service's minimum of "
            f"{SERVICE_MIN_WAIT_SECONDS}s: AI Platform would refuse it; aiptrain applies it as given."
        )
    replicas = replicas_for(ti)
    trials_notice = None
    if ti.hyperparameters and runs_here:
        trials_notice = admission.trials_at_once(ti.hyperparameters, len(replicas), os.cpu_count() or 1,
                                                 settings.max_running_replicas).notice()
    if trials_notice:
        notices.append(trials_notice)

    package_path = validate_package_path(flags.package_path) if flags.package_path else None
    local_packages, remote_packages = split_packages(flags.packages)
    runtime_image, rt, runtime_given_as = None, None, "--runtime-version"
    has_packages = bool(package_path or local_packages or remote_packages or ti.package_uris)
    if ti.uses_custom_container and has_packages:
        check_package_in_image(ti)
    algorithm = algorithm_of(ti.master_config.image_uri) if ti.master_config else None
    if algorithm is not None:
        check_built_in_algorithm(algorithm, replicas, has_packages)
    if not ti.uses_custom_container:
        if not has_packages:
            raise ValidationError(
                "If `--package-path` is not specified, at least one Python package must be specified via `--packages`."
            )
        if not ti.python_module:
            raise ValidationError("--module-name is required: name the module to run, e.g. `trainer.task`.")
        validate_module_name(ti.python_module)
        runtime_given_as = _runtime_given_as(flags, ti.runtime_version)
        ti.runtime_version = ti.runtime_version or settings.default_runtime_version
        rt = lookup_runtime(ti.runtime_version, settings.home, runtime_given_as)
        runtime_image = rt.image

    staging_bucket = flags.staging_bucket or settings.default_bucket or None
    check_local_bucket(staging_bucket)
    gcs_root, gcs_notice = _gcs_mode(
        [ti.job_dir, staging_bucket, *remote_packages, *(ti.package_uris or []), *gcs_urls_in(ti.args)], settings
    )
    backend = flags.backend or settings.backend
    job_dir_mount = None
    if ti.job_dir and not is_gcs(ti.job_dir):
        job_dir_mount = ti.job_dir = _local_job_dir(ti.job_dir, settings.home)
    return Submission(
        job=job,
        replicas=replicas,
        package_path=package_path,
        local_packages=local_packages,
        remote_packages=remote_packages,
        runtime_image=runtime_image,
        job_dir_mount=job_dir_mount,
        staging_bucket=staging_bucket,
        limit_resources=flags.limit_resources,
        installation=settings.installation_id,
        gcs_root=gcs_root,
        notices=tuple(notices) + ((gcs_notice,) if gcs_notice else ()),
        trials_notice=trials_notice,
        project=flags.project,
        runtime=rt,
        runtime_given_as=runtime_given_as,
        pids_limit=settings.replica_pids_limit,
        backend=backend,
        serves_gcs=gcs_root is not None,  # both backends run the storage endpoint
        algorithm=algorithm,
    )


def check_built_in_algorithm(algorithm: Algorithm, replicas: list[Replica], has_packages: bool) -> None:
    """A built-in algorithm trains on one machine, from its own code (the service's limits)."""
    others = sorted({r.task_type for r in replicas if r.task_type != "master"})
    if others:
        raise ValidationError(
            f"The built-in {algorithm.title} trains on one replica, and this job also asks for {' and '.join(others)} "
            "replicas: use --scale-tier BASIC (or CUSTOM with a master only), or write a training application for "
            "distributed training."
        )
    if has_packages:
        raise ValidationError(f"The built-in {algorithm.title} runs its own code: drop --package-path and --packages "
                              f"to run {algorithm.image}.")


def resume_study(job: Job, previous_job: PreviousJob) -> Job | None:
    """A tuning job that resumes a previous one's study (resumePreviousJobId) takes what defines
    that study where its own spec leaves it out: the params above all (the service took a resumed
    spec without them), the goal, the metric tag, the algorithm and early stopping
    (HyperparameterSpec.resumed_from). The job's resource shows what it took. The previous job,
    or None when the job resumes nothing; ValidationError when it names no tuning job, or when the
    two specs do not fit together."""
    from pydantic import ValidationError as PydanticError

    spec = job.training_input.hyperparameters
    previous_id = spec.resume_previous_job_id if spec else None
    if spec is None or not previous_id:
        return None
    previous = previous_job(previous_id)
    if previous is None or not previous.training_input.hyperparameters:
        raise ValidationError(
            f"trainingInput.hyperparameters.resumePreviousJobId [{previous_id}] is not a hyperparameter "
            "tuning job here: name one that `aiptrain jobs list` shows, or leave it out."
        )
    try:
        job.training_input.hyperparameters = spec.resumed_from(previous.training_input.hyperparameters)
    except PydanticError as exc:
        where = f"trainingInput.hyperparameters with the study of resumePreviousJobId [{previous_id}]"
        raise ValidationError(pydantic_error_line(exc, where)) from None
    return previous


def gcloud_refusals(flags: SubmitFlags, job: Job) -> list[str]:
    """What gcloud 528 refuses in this command line before sending it, where older releases sent
    it (scripts were written for those): aiptrain takes it, and says so in one warning line each.
    `job`: the job the line makes, its region given."""
    said = []
    ti = job.training_input
    if flags.scale_tier:
        custom_by = "--scale-tier custom" if normalize_scale_tier(flags.scale_tier) is ScaleTier.CUSTOM else None
    else:  # gcloud reads the --config file's tier too, where it is spelled as the flag's choice
        custom_by = "scaleTier: custom in the --config file" if config_scale_tier(flags.config) == "custom" else None
    if custom_by and not flags.master_machine_type:
        where = ", even where the --config file sets masterType" if ti.master_type else ""
        said.append(f"gcloud 528 would refuse this command line: {custom_by} requires --master-machine-type{where}; "
                    f"add --master-machine-type {ti.master_type or 'MACHINE_TYPE'}.")
    if not flags.region and not gcloud_property("compute/region"):
        where = ", even where the --config file sets region" if flags.config else ""
        said.append("gcloud 528 would refuse this command line: it requires --region or the compute/region property"
                    f"{where}; add --region {ti.region} (the region this job records).")
    return said


def _gcs_mode(urls: list[str | None], settings: Settings) -> tuple[Path | None, str | None]:
    """(where gs:// paths are kept on this machine, or None for Cloud Storage; a notice to show
    when the job names gs:// URLs), after checking every gs:// URL of the job. Decided for
    every job: a trainer may build gs:// paths that no flag names."""
    gcs_urls = [url for url in urls if url and is_gcs(url)]
    gcs_root, notice = gcs_root_for(settings.gcs_mode, settings.gcs_root)
    for url in gcs_urls:
        check_gcs_uri(url, kept_locally=gcs_root is not None)
    return gcs_root, notice if gcs_urls else None


def _runtime_given_as(flags: SubmitFlags, runtime_version: str | None) -> str:
    """Where the runtime version came from, as errors about it name it."""
    if flags.runtime_version:
        return "--runtime-version"
    return "runtimeVersion in the config file" if runtime_version else "AIPTRAIN_DEFAULT_RUNTIME"


def plan_inputs(
    submission: Submission,
    package_dir: Path | None,
    package_files: list[str],
    wheelhouse: bool = False,
    host_gateway: str | None = None,
    gcs_endpoint: StorageEndpoint | None = None,
    storage_credential: ProjectCredential | None = None,
    project: str = "",
) -> PlanInputs:
    extra_env: dict[str, str] = {}
    extra_mounts: tuple[Mount, ...] = ()
    if submission.writes_remote_gcs:
        # Replicas get the gs:// places unchanged, and what they need to reach that storage.

        extra_env, files = replica_access(host_gateway)
        extra_mounts = tuple(Mount(source, target, read_only=True) for source, target in files)
    if submission.credentials_file is not None:
        extra_env = {**extra_env, "GOOGLE_APPLICATION_CREDENTIALS": CONTAINER_CREDENTIALS}
        extra_mounts = (*(m for m in extra_mounts if m.target != CONTAINER_CREDENTIALS),
                        Mount(str(submission.credentials_file), CONTAINER_CREDENTIALS, read_only=True))
    return PlanInputs(
        runtime_image=submission.runtime_image,
        package_files=tuple(package_files),
        package_dir=str(package_dir) if package_dir else None,
        wheelhouse=WHEELHOUSE if wheelhouse else None,
        job_dir_mount=submission.job_dir_mount,
        user=replica_user(),
        host_cpus=os.cpu_count() or 1,
        host_memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        limit_resources=submission.limit_resources,
        installation=submission.installation,
        pids_limit=submission.pids_limit,
        extra_env=extra_env,
        extra_mounts=extra_mounts,
        gcs_root=str(submission.gcs_root) if submission.gcs_root else None,
        gcs_endpoint=gcs_endpoint,
        storage_credential=storage_credential if gcs_endpoint else None,
        contract=_with_buckets(submission, project),
        rules=submission.rules,
    )


def _with_buckets(submission: Submission, project: str) -> ReplicaContract | None:
    """The contract with the buckets its replicas see as directories: those the job's project
    may use, as they are at submit (made by then: the job's output bucket among them)."""
    contract = submission.contract
    if contract is None or not contract.bucket_mount_dir or submission.gcs_root is None:
        return contract
    usable = projects.usable_buckets(submission.gcs_root, project, dict(submission.shared_buckets))
    return dataclasses.replace(contract, buckets=tuple(sorted(usable.items())))


def storage_endpoint(submission: Submission, settings: Settings, prepare_files: bool = True) -> StorageEndpoint | None:
    """The installation's storage endpoint, when it serves this job's gs:// (its TLS files and
    the gcs tree made ready for it first, unless `prepare_files` is False: a dry run, or an
    installation's `ensure_storage_endpoint` to follow, which makes them)."""
    if not submission.serves_gcs or submission.gcs_root is None:
        return None
    endpoint = storage_endpoint_for(settings, submission.gcs_root, submission.runtime_image)
    if prepare_files:
        endpoint.prepare_files()
    return endpoint


def gcs_places(submission: Submission) -> list[str]:
    """The gs:// places a job writes (its job dir, the staging bucket) and reads (its packages)."""
    ti = submission.job.training_input
    output_dir = submission.contract.output_dir if submission.contract else None
    return [uri for uri in (ti.job_dir, output_dir, submission.staging_bucket, *submission.remote_packages,
                            *(ti.package_uris or [])) if uri and is_gcs(uri)]


def check_buckets(submission: Submission, settings: Settings) -> None:
    """A job names only buckets its project may use (those kept on this machine: Cloud Storage's
    are Google's to judge); ValidationError (exit 2, API 400) naming the first other one."""
    if submission.gcs_root is not None:
        projects.check_buckets(submission.gcs_root, submission.project or settings.default_project,
                               gcs_places(submission), dict(submission.shared_buckets))


def launch_failure(error_message: str) -> str:
    """The engine's refusal in a job's error message, without the pointer to the logs."""
    return error_message.split("\n\nTo find out more", 1)[0]


def _tried(step: Callable[[], object]) -> None:
    """One step of undoing a refused submission: every step is tried even when one fails (a full
    disk, say), so the error shown is the one that refused it, and whatever can go goes."""
    try:
        step()
    except Exception as exc:
        log.info("Undoing the submission left something behind: %s", exc)


class Submitter:
    """Carries one submission from validated flags to running replicas."""

    def __init__(self, settings: Settings, store: JobStore, backend: Backend,
                 report: Callable[[str], None] | None = None, build_progress: Callable[[str], None] | None = None):
        """`build_progress`: a runtime image the engine lacks (or an older aiptrain built) is
        built first, this hearing the build; None: such an image is refused (AIPTRAIN_AUTO_BUILD=0)."""
        self.settings = settings
        self.store = store
        self.backend = backend
        self._report = report or (lambda step: None)
        self._build_progress = build_progress

    def _step(self, text: str) -> None:
        """Say what submit is doing: a spinner on a terminal, a log line at --verbosity info."""
        log.info(text)
        self._report(text)

    def submit(self, submission: Submission, wait: bool = True) -> Job:
        """The job, recorded and handed to the controller; with `wait`, once its replicas run
        (a launch the engine refused is then this call's error), else as queued."""
        job = submission.job
        # Job IDs are unique per project; inside the installation the job goes by its key.
        project = submission.project or self.settings.default_project
        self._check_resumed_study(job, project)
        self.settings.ensure_dirs()
        job, key, lock = self._reserve(job, project)
        # Connecting to Docker (importing its SDK, negotiating the API), the storage endpoint's
        # start and the controller's start-up overlap the packaging. The controller leaves the
        # job alone while we hold its lock.
        try:
            control.ensure_running(self.settings)
            threading.Thread(target=self._get_ready, args=(submission,), daemon=True).start()
            control.wake(self.settings, key)
            with JobLogWriter(self.settings.job_paths(key).log) as job_log:
                self._record(submission, job, key, job_log)
        except BaseException:
            lock.remove()  # rejected: nobody will drive this job
            raise
        lock.release()
        control.wake(self.settings, key)  # the controller launches it, now or once admitted
        return self._launched(key) if wait else self.store.require(key)

    def _reserve(self, job: Job, project: str) -> tuple[Job, str, JobLock]:
        """The job's ID taken in `project`, once: its key, its lock (against a concurrent submit
        of the same ID) and then its row (against a job of the project that has it; the store
        refuses a second row atomically). The job as recorded, its key, and its lock, held. The
        plain key (the default project's) is tried first; only when a job of another project
        holds it (made under another default) is the qualified key taken instead."""
        default = self.store.default_project
        for key in dict.fromkeys((new_key(project, job.job_id, default, plain_taken=False),
                                  qualified_key(project, job.job_id))):
            lock = JobLock.try_acquire(self.settings.job_paths(key).lock)
            if lock is None:
                raise duplicate_job(job.job_id)  # another process is submitting this very ID
            try:
                return self.store.create(job, backend=self.backend.name, project=project, key=key), key, lock
            except JobExists:
                holder = self.store.key_of(project, job.job_id)  # the project's job of this ID, if any
                self._let_go(lock, key)
                if holder is not None:
                    raise
            except BaseException:
                lock.remove()  # no job has this key: no lock file either
                raise
        raise duplicate_job(job.job_id)

    def _let_go(self, lock: JobLock, key: str) -> None:
        """A lock taken for a key another job has: left in place for that job while it is active
        (its controller's), removed once it has ended (its teardown removed the file; taking the
        lock made it again)."""
        other = self.store.get(key)
        if other is not None and other.state not in TERMINAL_STATES:
            lock.release()
        else:
            lock.remove()

    def _runtime_image(self, submission: Submission) -> ImageInfo | None:
        """The runtime image as the engine has it (None: a custom container, or no such image),
        asked once: built first when it is missing or stale and builds are on; refused when it is
        missing and cannot be built here. A missing one that can be built is left to the
        backend's readiness check, which says how."""
        rt = submission.runtime
        if rt is None:
            return None
        image = self.backend.inspect_image(rt.image)
        if self._build_progress is not None and not is_current(rt, image.labels if image else None):
            # Built now, or by another submit while this one waited for the build's lock: asked again.
            ensure_image(rt, self.settings.cache_dir, self._build_progress, submission.runtime_given_as)
            image = self.backend.inspect_image(rt.image)
        if image is None:
            check_available(rt, submission.runtime_given_as, present=False)
        return image

    def _algorithm_image(self, submission: Submission, job: Job) -> str | None:
        """A built-in algorithm's image (the name the job gave), asked once: built first when it is
        missing or stale and builds are on, refused when missing otherwise. The job's
        trainingOutput says what its labels declare (isBuiltInAlgorithmJob, builtInAlgorithmOutput),
        from its creation on, as the service's did. None for any other job."""
        algorithm = submission.algorithm
        master = job.training_input.master_config
        if algorithm is None or master is None or not master.image_uri:
            return None
        image = self.backend.inspect_image(master.image_uri)
        if self._build_progress is not None and not algorithm_images.is_current(algorithm, image.labels if image else None):
            algorithm_images.ensure_image(algorithm, self.settings.cache_dir, self._build_progress)
            image = self.backend.inspect_image(master.image_uri)
        if image is None:
            raise EnvironmentNotReady(
                f"Image [{master.image_uri}] of the built-in {algorithm.title} is not on this Docker engine: build it "
                f"with `aiptrain algorithms build {algorithm.name}` (a submit builds it unless AIPTRAIN_AUTO_BUILD=0)."
            )
        output = output_of(image.labels)
        if output is not None:
            job.training_output = TrainingOutput(is_built_in_algorithm_job=True, built_in_algorithm_output=output)
        return master.image_uri

    def _get_ready(self, submission: Submission) -> None:
        """Connect to the engine and start the installation's storage endpoint when it serves
        this job's gs://: beside the packaging, in this process, since a new home's controller
        is still importing then (a first job's replicas waited for the endpoint after its
        staging). The controller's launch makes sure of it again, and reports a failure; one
        started for a job that is then refused goes when the controller does (release_shared)."""
        installation = self.backend.installation
        installation.warm_up()
        try:
            endpoint = storage_endpoint(submission, self.settings, prepare_files=False)  # the backend makes them
            if endpoint is not None:
                installation.ensure_storage_endpoint(endpoint)
        except Exception as exc:  # noqa: BLE001 - the launch meets it again, and says it
            log.info("Could not start the storage endpoint ahead of the launch: %s", exc)

    def _launched(self, key: str) -> Job:
        """An admitted job once the controller has launched it: submit returns when the replicas
        run, and a launch the engine refused is submit's error (exit 3), as when submit launched."""
        self._step("Starting the replicas")
        started = looked = time.monotonic()
        while (job := self.store.require(key)).state is State.PREPARING:
            now = time.monotonic()
            if now - looked > 1:  # a controller killed meanwhile is replaced
                control.ensure_running(self.settings)
                looked = now
            time.sleep(QUICK_LAUNCH_LOOK_SECONDS if now - started < QUICK_LAUNCH_SECONDS else LAUNCH_LOOK_SECONDS)
        if job.state is State.FAILED and job.error_message:
            raise EnvironmentNotReady(launch_failure(job.error_message))
        return job

    def _storage_credential(self, submission: Submission) -> ProjectCredential | None:
        """The job's project's credential for its replicas, and the buckets its submit makes (the
        job dir's, the staging bucket) made for that project."""
        if submission.gcs_root is None or not submission.serves_gcs:
            return None

        project = submission.project or self.settings.default_project
        make_buckets(submission.gcs_root, gcs_places(submission), project)
        return project_credential(self.settings.home / TLS_DIR_NAME, submission.gcs_root, project,
                                  submission.shared_buckets)

    def _check_resumed_study(self, job: Job, project: str) -> None:
        def previous_job(job_id: str) -> Job | None:
            key = self.store.key_of(project, job_id)
            return self.store.get(key) if key else None

        previous = resume_study(job, previous_job)
        if previous is not None and previous.state not in TERMINAL_STATES:
            raise ValidationError(
                f"resumePreviousJobId [{previous.job_id}] is still {(previous.state or State.QUEUED).value}: "
                "wait for it to end."
            )

    def _record(self, submission: Submission, job: Job, key: str, job_log: JobLogWriter) -> None:
        """From a recorded job to one queued for the controller, telling the job's log as the
        service would: stage and plan, keep the plan inputs in the job's work dir, and ask for
        admission. The controller launches it (a study's trials too) from those inputs."""
        job_log.service("Validating job requirements...")
        _, inputs = self._stage_and_plan(submission, job, key)
        if inputs.installed:
            packages = " ".join(f"{PACKAGES_DIR}/{name}" for name in inputs.package_files)
            job_log.service(f"Installed the packages once for every replica: {packages}")
        job_log.service("Job creation request has been successfully validated.")
        for notice in filter(None, (submission.trials_notice, *submission.log_notices)):
            job_log.service(notice, "WARNING")
        job_log.service(f"Job {job.job_id} is queued.")
        paths = self.settings.job_paths(key)
        if inputs.contract:  # kept past the job's end, for `jobs export`
            save_contract(paths.contract, inputs.contract)
        save_plan_inputs(paths.plan_inputs, inputs)
        verdict = admission.request(self.store, key, job, self.settings.max_running_replicas)
        if not verdict.admitted:
            self._step("Queued: the job starts when the machine has room for it")
            job_log.service(verdict.reason or "")

    def _stage_and_plan(self, submission: Submission, job: Job, key: str) -> tuple[LaunchPlan, PlanInputs]:
        """Package, resolve dependencies, stage, fetch and plan; on any error leave no trace
        of the job. What can be refused (the build, a missing gs:// package, a dependency with
        no wheel) is refused before anything is written to the bucket."""
        paths = self.settings.job_paths(key)
        package_dir = paths.packages
        with contextlib.ExitStack() as undo:  # a refused submission: its steps undone in reverse
            for forget in (functools.partial(self.store.delete, key),
                           functools.partial(paths.log.unlink, missing_ok=True),
                           functools.partial(shutil.rmtree, paths.work_dir, ignore_errors=True)):
                undo.callback(_tried, forget)
            image = self._runtime_image(submission)
            algorithm_image = self._algorithm_image(submission, job)
            created = self._ensure_job_dir(Path(submission.job_dir_mount), submission.gcs_root) \
                if submission.job_dir_mount else None
            if created is not None:
                undo.callback(_tried, functools.partial(shutil.rmtree, created, ignore_errors=True))
            ti = job.training_input
            files = list(submission.local_packages)
            trainer_wheel = None
            if submission.package_path:
                self._step(f"Packaging {submission.package_path}")
                built = cached_sdist(submission.package_path, self.settings.cache_dir, (self.settings.home,))
                files.append(built.path)
                trainer_wheel = built.wheel
                check_unique_names([p.name for p in files] + [u.rsplit("/", 1)[-1] for u in submission.remote_packages])
            # gs:// packages come first and are passed through; packageUris from --config
            # count only when the flags name no package.
            remote = submission.remote_packages if files or submission.remote_packages else list(ti.package_uris or [])
            remote_files = staging.fetch(remote, package_dir, submission.gcs_root)
            wheels = []
            if submission.runtime:
                fetched = [package_dir / name for name in remote_files]
                self._step("Resolving the packages' dependencies into a wheelhouse")
                rt = submission.runtime
                wheels = wheelhouse.resolve(
                    [*files, *fetched], self.settings.cache_dir, rt.python, image_contents(rt, image.labels if image else None)
                )
            bucket_url, prefix = staging.staging_target(
                job.job_id, submission.staging_bucket, ti.job_dir, str(self.settings.bucket_root), key
            )
            credential = self._storage_credential(submission)  # what can be refused was: the buckets are made
            self._step(f"Staging {len(files) + len(wheels)} file(s) to {bucket_url}")
            index = staging.StagedIndex(self.settings.cache_dir / "staged-objects.json")
            staged = staging.stage(files, bucket_url, prefix, index, wheels, submission.gcs_root)
            undo.callback(_tried, staged.discard)
            ti.package_uris = (remote + staged.uris) or None  # the service omits empty lists
            self.store.update_resource(key, job)
            # Replicas take the packages and the wheelhouse from this host (the gs:// ones fetched
            # above, the local ones as they were staged): the bucket's copy is the record.
            for path in files:
                if not (package_dir / path.name).exists():
                    copy_regular(path, package_dir / path.name)
            package_files = remote_files + [path.name for path in files]
            staging.link_files(wheels, paths.wheelhouse)
            inputs = plan_inputs(submission, package_dir, package_files, bool(wheels), self._host_gateway(submission),
                                 storage_endpoint(submission, self.settings), credential,
                                 submission.project or self.settings.default_project)
            install_image = image if package_files and self.backend.host_dirs_reach_replicas else None
            if install_image is not None:
                # Where the install goes is known before it runs: one plan, checked (the engine's
                # refusal, a GPU runtime say, comes first), then the install it mounts.
                target = install_target(self.settings.cache_dir, install_image.id, package_dir, package_files,
                                        inputs.wheelhouse)
                inputs = dataclasses.replace(inputs, installed=str(target))
            launch_plan = plan(job, submission.replicas, inputs, key=key)
            present = (submission.runtime.image,) if image and submission.runtime else ()
            self.backend.check_ready(launch_plan, present=present + ((algorithm_image,) if algorithm_image else ()))
            if install_image is not None:
                # The trainer's own wheel may be unpacked here when it is all there is to install.
                alone = trainer_wheel if len(package_files) == 1 and not remote else None
                self._install_once(submission, key, inputs, install_image, alone)
            undo.pop_all()  # accepted: nothing to undo
            return launch_plan, inputs

    def _install_once(self, submission: Submission, key: str, inputs: PlanInputs, image: ImageInfo,
                      trainer_wheel: Path | None) -> str:
        """The packages installed for the runtime image once, for every replica (aiptrain.installs)."""
        assert submission.runtime_image and inputs.package_dir  # a runtime job with packages (the caller's check)
        self._step("Installing the packages once for every replica")
        owner = {LABEL_INSTALLATION: submission.installation} if submission.installation else {}
        target, installed_now = ensure_installed(
            self.backend, submission.runtime_image, image.id, Path(inputs.package_dir), list(inputs.package_files),
            inputs.wheelhouse, self.settings.cache_dir, inputs.user,
            {LABEL_INSTALL_FOR: key, **owner},
            PureTrainer(trainer_wheel, submission.runtime.python) if trainer_wheel and submission.runtime else None,
        )
        log.info("%s the packages for %s: %s", "Installed" if installed_now else "Reused", submission.runtime_image,
                 target)
        return str(target)

    def _host_gateway(self, submission: Submission) -> str | None:
        """This host's address as replicas reach it, needed only to point them at a storage
        emulator running here for a gs:// job dir."""
        if not (submission.writes_remote_gcs and emulator_host()):
            return None
        return self.backend.host_address()

    @staticmethod
    def _ensure_job_dir(path: Path, gcs_root: Path | None = None) -> Path | None:
        """Create the job dir if needed (returned, so it can be undone). When aiptrain runs
        as root, replicas run as nobody: a job dir created here is handed to nobody. Below the
        gcs root (a bucket earlier jobs wrote), and below the deepest directory that exists,
        links are refused, never followed (aiptrain.safe_files)."""
        owner = (NOBODY_ID, NOBODY_ID) if os.getuid() == 0 else None
        if gcs_root is not None and path.is_relative_to(gcs_root):
            base = gcs_root
            gcs_root.mkdir(parents=True, exist_ok=True)  # the home's own: trusted
        else:
            base = path
            while not os.path.lexists(base) and base.parent != base:
                base = base.parent
        if base == path and path.is_dir():
            return None
        missing = path
        while os.path.lexists(missing.parent) is False:
            missing = missing.parent
        created = None if os.path.lexists(missing) else missing
        safe_files.make_dirs(base, path.relative_to(base), owner if created is not None else None)
        return created

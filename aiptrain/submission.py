"""Submitting a job: check the flags (`prepare`, no side effects), then carry the
submission from package to running replicas (`Submitter`).

Submit order matters for "nothing half-created": every check that needs no side
effect runs first; then the job's lock is taken and its row recorded (which
reserves the ID atomically against concurrent submits); then the package is built
and staged; any rejection after that point undoes the row, staged objects and
scratch files before the error is shown. Once replicas start, the job is real:
later failures are recorded on the job, not undone.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from aiptrain.config import SubmitFlags, build_job
from aiptrain.errors import AiptrainError, ValidationError
from aiptrain.logs import JobLogWriter
from aiptrain.model import Job, State, TrainingInput
from aiptrain.ownership import JobLock
from aiptrain.planning import LaunchPlan, Mount, PlanInputs, plan
from aiptrain.settings import Settings
from aiptrain.staging import WHEELHOUSE
from aiptrain.store import JobStore, duplicate_job
from aiptrain.storage import is_gcs, local_path
from aiptrain.topology import Replica, replicas_for
from aiptrain.validation import (
    parse_duration_seconds,
    validate_job_id,
    validate_labels,
    validate_module_name,
    validate_package_path,
)

log = logging.getLogger(__name__)
NOBODY_ID = 65534
NOBODY = f"{NOBODY_ID}:{NOBODY_ID}"
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")


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
    pids_limit: int | None = None


def replica_user() -> str:
    """Replicas run as the calling user, or as nobody when that is root."""
    uid, gid = os.getuid(), os.getgid()
    return NOBODY if uid == 0 else f"{uid}:{gid}"


def _local_job_dir(job_dir: str) -> str:
    path = Path(local_path(job_dir))
    for socket in DOCKER_SOCKETS:
        if Path(socket).resolve().is_relative_to(path):
            raise ValidationError(
                f"--job-dir [{job_dir}] would expose the Docker socket to the replicas: use a dedicated directory."
            )
    if path.exists() and not path.is_dir():
        raise ValidationError(f"--job-dir [{job_dir}] exists and is not a directory: choose a directory.")
    return str(path)


def prepare(flags: SubmitFlags, settings: Settings) -> Submission:
    """Everything about a submission that can be checked without side effects."""
    validate_job_id(flags.job_id)
    job = build_job(flags)
    ti = job.training_input
    if flags.labels:
        validate_labels(flags.labels)
    _check_custom_container(ti)
    if not ti.region:
        ti.region = os.environ.get("CLOUDSDK_COMPUTE_REGION", "us-central1")
    if ti.scheduling and ti.scheduling.max_running_time:
        parse_duration_seconds(ti.scheduling.max_running_time, "scheduling.maxRunningTime")
    replicas = replicas_for(ti)

    package_path = validate_package_path(flags.package_path) if flags.package_path else None
    local_packages, remote_packages = _split_packages(flags.packages)
    runtime_image = None
    if not ti.uses_custom_container:
        if not package_path and not local_packages and not remote_packages and not ti.package_uris:
            raise ValidationError(
                "If `--package-path` is not specified, at least one Python package must be specified via `--packages`."
            )
        if not ti.python_module:
            raise ValidationError("--module-name is required: name the module to run, e.g. `trainer.task`.")
        validate_module_name(ti.python_module)
        from aiptrain.runtimes import runtime

        ti.runtime_version = ti.runtime_version or settings.default_runtime_version
        runtime_image = runtime(ti.runtime_version).image

    job_dir_mount = None
    if ti.job_dir and not is_gcs(ti.job_dir):
        job_dir_mount = ti.job_dir = _local_job_dir(ti.job_dir)
    return Submission(
        job, replicas, package_path, local_packages, remote_packages, runtime_image, job_dir_mount,
        flags.staging_bucket or settings.default_bucket or None,
        flags.limit_resources,
        settings.installation_id,
        settings.replica_pids_limit,
    )


# Each ReplicaConfig: its field, its name in the REST resource, and where users set its image.
_REPLICA_CONFIGS = (
    ("master_config", "masterConfig", "--master-image-uri"),
    ("worker_config", "workerConfig", "--worker-image-uri"),
    ("parameter_server_config", "parameterServerConfig", "--parameter-server-image-uri"),
    ("evaluator_config", "evaluatorConfig", "evaluatorConfig.imageUri"),
)


def _check_custom_container(ti: TrainingInput) -> None:
    """gcloud's and the REST API's rules for custom containers (reference §1.3, §3.3)."""
    if ti.uses_custom_container and ti.runtime_version:
        raise ValidationError("Only one of --master-image-uri, --runtime-version can be set.")
    for field, name, image_flag in _REPLICA_CONFIGS:
        config = getattr(ti, field)
        if config is None:
            continue
        sets_command = bool(config.container_command or config.container_args)
        if not ti.uses_custom_container and config.image_uri:
            # Other replica types default to the master's image; a runtime-version master has none.
            raise ValidationError(f"{image_flag} needs --master-image-uri: set the master's image too.")
        if not ti.uses_custom_container and sets_command:
            raise ValidationError(
                f"{name}.containerCommand and containerArgs need a custom container: set --master-image-uri."
            )
        if sets_command and ti.args:
            raise ValidationError(
                f"User args (after `--` or `args:` in --config) cannot be combined with {name}.containerCommand "
                "or containerArgs: put them in containerArgs instead."
            )


def _split_packages(packages: list[str]) -> tuple[list[Path], list[str]]:
    local, remote = [], []
    for entry in packages:
        if is_gcs(entry):
            remote.append(entry)
            continue
        path = Path(entry).expanduser()
        if not path.is_file():
            raise ValidationError(f"--packages entry [{entry}] is not a file: give a path to a .tar.gz or .whl.")
        local.append(path.resolve())
    check_unique_names([p.name for p in local] + [u.rsplit("/", 1)[-1] for u in remote])
    return local, remote


def check_unique_names(names: list[str]) -> None:
    """Packages share one directory in the replicas, as they share one upload in gcloud."""
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValidationError(f"Cannot upload multiple packages with the same filename: [{', '.join(duplicates)}]")


def plan_inputs(
    submission: Submission,
    package_dir: Path | None,
    package_files: list[str],
    wheelhouse: bool = False,
    host_gateway: str | None = None,
) -> PlanInputs:
    extra_env, extra_mounts = {}, ()
    job_dir = submission.job.training_input.job_dir
    if job_dir and is_gcs(job_dir):
        # Replicas get the gs:// job dir unchanged, and what they need to reach that storage.
        from aiptrain.storage.gcs import replica_access

        extra_env, files = replica_access(host_gateway)
        extra_mounts = tuple(Mount(source, target, read_only=True) for source, target in files)
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
    )


def dry_run_plan(submission: Submission) -> LaunchPlan:
    """The plan submit would launch, built without the bucket, the store or Docker.
    The sdist is built in a temporary directory to learn its file name and requirements."""
    files = [p.name for p in submission.local_packages] + [u.rsplit("/", 1)[-1] for u in submission.remote_packages]
    wheelhouse = False
    if submission.package_path:
        from aiptrain.packaging import build_sdist
        from aiptrain.wheelhouse import requirements_for

        with tempfile.TemporaryDirectory() as tmp:
            sdist = build_sdist(submission.package_path, Path(tmp)).path
            files.append(sdist.name)
            wheelhouse = bool(submission.runtime_image and requirements_for([*submission.local_packages, sdist]))
    inputs = plan_inputs(submission, Path("<job work dir>/packages"), files, wheelhouse)
    return plan(submission.job, submission.replicas, inputs)


class Submitter:
    """Carries one submission from validated flags to running replicas."""

    def __init__(self, settings: Settings, store: JobStore, backend, report: Callable[[str], None] | None = None):
        self.settings = settings
        self.store = store
        self.backend = backend
        self._report = report or (lambda step: None)

    def _step(self, text: str) -> None:
        """Say what submit is doing: a spinner on a terminal, a log line at --verbosity info."""
        log.info(text)
        self._report(text)

    def submit(self, submission: Submission) -> Job:
        job = submission.job
        self.settings.ensure_dirs()
        if self.store.exists(job.job_id):
            raise duplicate_job(job.job_id)
        lock = JobLock.try_acquire(self.settings.job_lock_path(job.job_id))
        if lock is None:
            raise duplicate_job(job.job_id)  # another process is submitting this very ID
        # Connecting to Docker (importing its SDK, negotiating the API) overlaps the packaging.
        warm_up = threading.Thread(target=self.backend.warm_up, daemon=True)
        warm_up.start()
        try:
            job = self.store.create(job)
            with JobLogWriter(self.settings.job_log_path(job.job_id)) as job_log:
                self._launch(submission, job, job_log)
            from aiptrain import supervisor

            supervisor.spawn(job.job_id, lock, self.settings)
        finally:
            lock.release()
        return self.store.get(job.job_id)

    def _launch(self, submission: Submission, job: Job, job_log: JobLogWriter) -> None:
        """From a recorded job to running replicas, telling the job's log as the service would."""
        job_log.service("Validating job requirements...")
        launch_plan = self._stage_and_plan(submission, job)
        job_log.service("Job creation request has been successfully validated.")
        job_log.service(f"Job {job.job_id} is queued.")
        self.store.transition(job.job_id, State.PREPARING, [State.QUEUED])
        job_log.service("Waiting for job to be provisioned.")
        self._step(f"Starting {len(launch_plan.containers)} replica(s)")
        try:
            self.backend.launch(launch_plan)
        except AiptrainError as exc:
            job_log.service(str(exc), "ERROR")
            self.store.transition(job.job_id, State.FAILED, [State.PREPARING, State.CANCELLING], str(exc))
            raise
        self.store.transition(job.job_id, State.RUNNING, [State.PREPARING])
        job_log.service("Waiting for training program to start.")

    def _stage_and_plan(self, submission: Submission, job: Job) -> LaunchPlan:
        """Package, resolve dependencies, stage, fetch and plan; on any error leave no trace
        of the job. What can be refused (the build, a missing gs:// package, a dependency with
        no wheel) is refused before anything is written to the bucket."""
        from aiptrain import staging

        staged = None
        created_job_dir = None
        work_dir = self.settings.job_work_dir(job.job_id)
        package_dir = work_dir / "packages"
        try:
            if submission.job_dir_mount:
                created_job_dir = self._ensure_job_dir(Path(submission.job_dir_mount))
            ti = job.training_input
            files = list(submission.local_packages)
            if submission.package_path:
                from aiptrain.packaging import cached_sdist

                self._step(f"Packaging {submission.package_path}")
                files.append(cached_sdist(submission.package_path, self.settings.cache_dir).path)
                check_unique_names([p.name for p in files] + [u.rsplit("/", 1)[-1] for u in submission.remote_packages])
            # gs:// packages come first and are passed through; packageUris from --config
            # count only when the flags name no package.
            remote = submission.remote_packages if files or submission.remote_packages else list(ti.package_uris or [])
            remote_files = staging.fetch(remote, package_dir)
            wheels = []
            if submission.runtime_image:
                from aiptrain import wheelhouse
                from aiptrain.runtimes import runtime

                fetched = [package_dir / name for name in remote_files]
                self._step("Resolving the packages' dependencies into a wheelhouse")
                preinstalled = runtime(ti.runtime_version).provides
                wheels = wheelhouse.resolve([*files, *fetched], self.settings.cache_dir, preinstalled=preinstalled)
            bucket_url, prefix = staging.staging_target(
                job.job_id, submission.staging_bucket, ti.job_dir, str(self.settings.bucket_root)
            )
            self._step(f"Staging {len(files) + len(wheels)} file(s) to {bucket_url}")
            index = staging.StagedIndex(self.settings.cache_dir / "staged-objects.json")
            staged = staging.stage(files, bucket_url, prefix, index, wheels)
            ti.package_uris = (remote + staged.uris) or None  # the service omits empty lists
            self.store.update_resource(job)
            package_files = staging.fetch(ti.package_uris or [], package_dir)
            # Replicas take the wheelhouse from this host's cache: the bucket's copy is the record.
            staging.link_files(wheels, package_dir / WHEELHOUSE)
            inputs = plan_inputs(submission, package_dir, package_files, bool(wheels), self._host_gateway(ti.job_dir))
            launch_plan = plan(job, submission.replicas, inputs)
            self.backend.check_ready(launch_plan)
            return launch_plan
        except BaseException:
            if staged is not None:
                staged.discard()
            if created_job_dir is not None:
                shutil.rmtree(created_job_dir, ignore_errors=True)
            shutil.rmtree(work_dir, ignore_errors=True)
            self.settings.job_log_path(job.job_id).unlink(missing_ok=True)
            self.store.delete(job.job_id)
            raise

    def _host_gateway(self, job_dir: str | None) -> str | None:
        """This host's address as replicas reach it, needed only to point them at a storage
        emulator running here for a gs:// job dir."""
        if not (job_dir and is_gcs(job_dir) and os.environ.get("STORAGE_EMULATOR_HOST")):
            return None
        return self.backend.host_address()

    @staticmethod
    def _ensure_job_dir(path: Path) -> Path | None:
        """Create the job dir if needed (returned, so it can be undone). When aiptrain runs
        as root, replicas run as nobody: a job dir created here is handed to nobody."""
        created = None
        if not path.exists():
            missing = path
            while not missing.parent.exists():
                missing = missing.parent
            path.mkdir(parents=True)
            created = missing
        if os.getuid() == 0 and created is not None:
            os.chown(path, NOBODY_ID, NOBODY_ID)
        return created

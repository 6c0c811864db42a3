"""What submit would launch, without launching it: a dry run's plan, and a job as Kubeflow
manifests: a Trainer v2 TrainJob (aiptrain.trainjob) or a legacy TFJob (aiptrain.tfjob) build
them; this adds what they need from this machine: the runtime's image, the restart budget,
where gs:// packages are kept, the ENTRYPOINT of custom images on the engine)."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from aiptrain.backends.engine import connect
from aiptrain.jobpaths import JobPaths
from aiptrain.model import Job
from aiptrain.packaging import build_sdist
from aiptrain.planning import LaunchPlan, ReplicaContract, plan
from aiptrain.runtimes import lookup as lookup_runtime
from aiptrain.settings import Settings
from aiptrain.staging import staging_target
from aiptrain.storage import gcs_root_for, is_gcs
from aiptrain.storage.endpoint import ProjectCredential
from aiptrain.submission import Submission, plan_inputs, storage_endpoint
from aiptrain.tfjob import Export, build_tfjob, with_note, with_warning
from aiptrain.topology import replicas_for
from aiptrain.trainjob import Runtime, TrainJobExport, build_trainjob
from aiptrain.tuning import first_trial
from aiptrain.validation import scheduling_seconds
from aiptrain.wheelhouse import requirements_for


def dry_run_packages(submission: Submission) -> tuple[list[str], list[str], bool]:
    """(names of the files submit would stage, gs:// URLs it would pass through, whether a
    wheelhouse would go with them), learnt without the bucket: the sdist is built in a
    temporary directory to learn its file name and requirements."""
    staged = [p.name for p in submission.local_packages]
    remote = list(submission.remote_packages)
    if not staged and not remote and not submission.package_path:  # as submit: packageUris from --config
        remote = list(submission.job.training_input.package_uris or [])
    wheelhouse = False
    if submission.package_path:
        with tempfile.TemporaryDirectory() as tmp:
            sdist = build_sdist(submission.package_path, Path(tmp)).path
            staged.append(sdist.name)
            wheelhouse = bool(submission.runtime_image and requirements_for([*submission.local_packages, sdist]))
    return staged, remote, wheelhouse


def dry_run_plan(submission: Submission) -> LaunchPlan:
    """The plan submit would launch, built without the bucket, the store or Docker."""
    staged, remote, wheelhouse = dry_run_packages(submission)
    sdist = staged[len(submission.local_packages):]
    files = staged[:len(submission.local_packages)] + [u.rsplit("/", 1)[-1] for u in remote] + sdist
    settings = Settings()
    project = submission.project or settings.default_project
    credential = ProjectCredential(project, "<the project's credential>", "<home>/storage-endpoint/credentials/"
                                   f"<{project}>.json")  # made by submit (aiptrain.storage.projects)
    paths = JobPaths(Path("<home>"), "<key>")  # submit's own: its key is chosen when the job is recorded
    inputs = plan_inputs(submission, paths.packages, files, wheelhouse,
                         gcs_endpoint=storage_endpoint(submission, settings, prepare_files=False),
                         storage_credential=credential, project=project)
    trial = None
    if submission.job.training_input.hyperparameters:
        trial = first_trial(submission.job.training_input.hyperparameters, str(paths.trial_dir("1")))
    return plan(submission.job, submission.replicas, inputs, trial)


# What stands for the digest of a dry run's staged packages: submit computes it when it stages them.
DIGEST_PLACEHOLDER = "<sha256>"


def _dry_run_uris(submission: Submission, settings: Settings) -> tuple[list[str], str | None]:
    """(the package URLs the job would have, the note a dry run's export carries, if any)."""
    staged, remote, _ = dry_run_packages(submission)
    ti = submission.job.training_input
    bucket_url, prefix = staging_target(
        submission.job.job_id, submission.staging_bucket, ti.job_dir, str(settings.bucket_root)
    )
    uris = remote + [f"{bucket_url.rstrip('/')}/{prefix}/{DIGEST_PLACEHOLDER}/{name}" for name in staged]
    note = None
    if staged and is_gcs(bucket_url):
        note = (f"A dry run: {DIGEST_PLACEHOLDER} in the package URLs is the digest submit gives them; export the "
                "submitted job for a manifest to apply.")
    return uris, note


def dry_run_tfjob(submission: Submission, settings: Settings) -> Export:
    """The TFJob of the job submit would run, its packages where submit would stage them."""
    uris, note = _dry_run_uris(submission, settings)
    export = tfjob_export(submission.job, uris, settings)
    return with_note(export, note) if note else export


def dry_run_trainjob(submission: Submission, settings: Settings, runtime: Runtime = Runtime.AUTO) -> TrainJobExport:
    """The TrainJob (and runtime) of the job submit would run, its packages where submit would stage them."""
    uris, note = _dry_run_uris(submission, settings)
    export = trainjob_export(submission.job, uris, settings, runtime)
    return replace(export, notes=(*export.notes, note)) if note else export


def _runtime_image(job: Job, settings: Settings) -> str | None:
    ti = job.training_input
    if ti.uses_custom_container:
        return None
    return lookup_runtime(ti.runtime_version or settings.default_runtime_version, settings.home,
                          "runtimeVersion").image


def _kept_here_warning(job: Job, package_uris: list[str], settings: Settings,
                       contract: ReplicaContract | None) -> str | None:
    """What the job's pods would read or write in Cloud Storage that is kept on this machine."""
    kept = ["packages"] if any(is_gcs(uri) for uri in package_uris) else []
    if contract and contract.output_dir and contract.output_env:
        kept.append(f"output directory {contract.output_dir}")
    if contract and contract.bucket_mount_dir and contract.buckets:
        kept.append(f"buckets under {contract.bucket_mount_dir}")
    gcs_root = gcs_root_for(settings.gcs_mode, settings.gcs_root)[0] if kept else None
    if gcs_root is None:
        return None
    return (f"The gs:// {' and '.join(kept)} of job [{job.job_id}] are kept on this machine (AIPTRAIN_GCS=local), "
            f"under {gcs_root}: copy them to Cloud Storage (`gsutil cp -r {gcs_root}/BUCKET gs://BUCKET`) before "
            "applying.")


def tfjob_export(job: Job, package_uris: list[str], settings: Settings,
                 contract: ReplicaContract | None = None) -> Export:
    """The job as a Kubeflow TFJob (aiptrain.tfjob), with what that needs from this machine:
    the runtime's image, the restart budget, whether its gs:// data is kept here, and where its
    pods run a bootstrap (a `contract`'s CLUSTER_SPEC), the ENTRYPOINTs of its custom images."""
    entrypoints = image_entrypoints(job) if contract and contract.cluster_spec_names else None
    export = build_tfjob(job, replicas_for(job.training_input), _runtime_image(job, settings), package_uris,
                         settings.max_restarts, scheduling_seconds(job, "max_running_time"), contract, entrypoints)
    warning = _kept_here_warning(job, package_uris, settings, contract)
    return with_warning(export, warning) if warning else export


def trainjob_export(job: Job, package_uris: list[str], settings: Settings, runtime: Runtime = Runtime.AUTO,
                    contract: ReplicaContract | None = None) -> TrainJobExport:
    """The job as a Kubeflow Trainer v2 TrainJob and its runtime (aiptrain.trainjob), with what
    that needs from this machine, and the ENTRYPOINTs of its custom images where the engine has
    them. `contract`: what the job (of another dialect) told its replicas, kept since its submit."""
    export = build_trainjob(job, replicas_for(job.training_input), _runtime_image(job, settings), package_uris,
                            settings.max_restarts, scheduling_seconds(job, "max_running_time"), runtime,
                            image_entrypoints(job), contract)
    warning = _kept_here_warning(job, package_uris, settings, contract)
    return replace(export, warnings=(*export.warnings, warning)) if warning else export


def image_entrypoints(job: Job) -> dict[str, list[str]]:
    """The ENTRYPOINT of each custom image the job runs without containerCommand, from the
    engine; an image it does not have (or no engine) is left out, and the export warns."""
    ti = job.training_input
    if not ti.uses_custom_container:
        return {}
    configs = [ti.master_config, ti.worker_config, ti.parameter_server_config, ti.evaluator_config]
    images = {c.image_uri for c in configs if c and c.image_uri and not c.container_command}
    found: dict[str, list[str]] = {}
    for image in sorted(images):
        try:
            found[image] = list(connect().inspect_image(image).get("Config", {}).get("Entrypoint") or [])
        except Exception:  # noqa: BLE001 - no engine or no such image: the export warns and says what to do
            continue
    return found

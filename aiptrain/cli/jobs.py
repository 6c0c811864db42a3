"""`aiptrain jobs ...`: the verbs of `gcloud ai-platform jobs`, with gcloud's flags,
messages and exit statuses (reference: aiplatform.md §1, §2, §7)."""

from __future__ import annotations

import sys
from functools import cached_property

import click

from aiptrain.errors import EXIT_INTERRUPTED, EXIT_JOB_FAILED, EXIT_OK


class Services:
    """The settings, store and backend a command uses, created on first use."""

    @cached_property
    def settings(self):
        from aiptrain.settings import Settings

        return Settings()

    @cached_property
    def store(self):
        from aiptrain.store import JobStore

        self.settings.ensure_dirs()
        return JobStore(self.settings.store_path)

    @cached_property
    def backend(self):
        from aiptrain.backends.docker import DockerBackend

        return DockerBackend.from_settings(self.settings)

    def backend_factory(self):
        return self.backend

    def job(self, job_id: str):
        """The job, reconciled first if nobody drives it any more; JobNotFound if there is none."""
        from aiptrain.jobs import get_job

        return get_job(job_id, self.settings, self.store, self.backend_factory)


def _yaml(data) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=True, default_flow_style=False, allow_unicode=True)


def _summary(job, fields=("endTime", "jobId", "startTime", "state")) -> str:
    resource = job.to_resource()
    return _yaml({k: resource[k] for k in fields if k in resource})


def _follow_up(job_id: str) -> str:
    return (
        "Your job is still active. You may view the status of your job with the command\n\n"
        f"  $ aiptrain jobs describe {job_id}\n\n"
        "or continue streaming the logs with the command\n\n"
        f"  $ aiptrain jobs stream-logs {job_id}"
    )


def _labels(value: str | None) -> dict[str, str] | None:
    if value is None:
        return None
    labels = {}
    for item in filter(None, value.split(",")):
        key, sep, val = item.partition("=")
        if not sep:
            raise click.BadParameter(f"[{item}] is not KEY=VALUE", param_hint="--labels")
        labels[key] = val
    return labels


def _packages(value: tuple[str, ...]) -> list[str]:
    packages = []
    for item in value:
        packages += [p for p in item.split(",") if p]
    return packages


@click.group()
def jobs() -> None:
    """Submit and manage AI Platform training jobs on this machine's Docker engine."""


@jobs.group()
def submit() -> None:
    """Submit a job."""


@submit.command(
    context_settings={"ignore_unknown_options": False},
    epilog="Arguments after `--` are passed to the trainer; `--job-dir DIR` is appended to them.",
)
@click.argument("job_id", metavar="JOB")
@click.argument("user_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- USER_ARGS...]")
@click.option("--config", help="YAML or JSON file holding a Job resource (trainingInput: ...).")
@click.option("--job-dir", help="Directory (local path, file:// or gs://) for the job's output; passed as --job-dir.")
@click.option("--labels", help="KEY=VALUE,... labels for the job.")
@click.option("--module-name", help="Python module to run, e.g. trainer.task.")
@click.option("--package-path", help="Local directory of the Python package to build and stage.")
@click.option("--packages", multiple=True, help="Extra packages, comma-separated: local files or gs:// URLs.")
@click.option("--staging-bucket", help="Bucket for staged packages: a directory, file:// or gs:// URL.")
@click.option("--region", help="Region recorded on the job (default: $CLOUDSDK_COMPUTE_REGION or us-central1).")
@click.option("--scale-tier", help="basic, standard-1, premium-1, basic-gpu or custom.")
@click.option("--runtime-version", help="Runtime version (image) to run the trainer in; see `aiptrain runtimes list`.")
@click.option("--python-version", help="Recorded on the job; the runtime image decides the Python.")
@click.option("--master-machine-type", help="Machine type of the master (required with --scale-tier custom).")
@click.option("--master-accelerator", help="type=nvidia-tesla-t4,count=1")
@click.option("--master-image-uri", help="Custom container image for the master.")
@click.option("--worker-machine-type")
@click.option("--worker-count", type=int)
@click.option("--worker-accelerator")
@click.option("--worker-image-uri")
@click.option("--parameter-server-machine-type")
@click.option("--parameter-server-count", type=int)
@click.option("--parameter-server-accelerator")
@click.option("--parameter-server-image-uri")
@click.option("--use-chief-in-tf-config", type=click.BOOL, help="Name the primary `chief` in TF_CONFIG.")
@click.option("--service-account", help="Recorded on the job.")
@click.option("--enable-web-access", is_flag=True, help="Recorded on the job.")
@click.option("--async", "async_", is_flag=True, help="Deprecated: submitting is asynchronous by default.")
@click.option("--stream-logs", is_flag=True, help="Stream the logs until the job ends; exit 1 unless it succeeded.")
@click.option("--limit-resources", is_flag=True, envvar="AIPTRAIN_LIMIT_RESOURCES",
              help="Limit each replica to its machine type's vCPUs and memory, scaled so the job fits this host.")
@click.option("--dry-run", is_flag=True, help="Print the launch plan (every container) and do nothing else.")
@click.option("--verbosity", type=click.Choice(["debug", "info", "warning", "error", "critical", "none"]),
              default="warning", help="How much aiptrain says about what it does.")
def training(job_id, user_args, config, labels, packages, async_, stream_logs, dry_run,
             verbosity, **flags) -> None:
    """Submit a training job, as `gcloud ai-platform jobs submit training`."""
    from aiptrain.config import SubmitFlags
    from aiptrain.submission import Submitter, dry_run_plan, prepare

    if async_ and stream_logs:
        raise click.UsageError("argument --async: At most one of --async | --stream-logs may be specified.")
    _configure_logging(verbosity)
    if async_:
        click.echo(
            "WARNING: The --async flag is deprecated, as the default behavior is to submit the job "
            "asynchronously; it can be omitted. For synchronous behavior, please pass --stream-logs.",
            err=True,
        )
    services = Services()
    submit_flags = SubmitFlags(
        job_id=job_id, config=config, labels=_labels(labels), packages=_packages(packages),
        user_args=list(user_args), **flags,
    )
    submission = prepare(submit_flags, services.settings)
    if dry_run:
        click.echo(_yaml(dry_run_plan(submission).to_dict()), nl=False)
        return
    from aiptrain.cli.output import spinner

    with spinner() as report:
        job = Submitter(services.settings, services.store, services.backend, report).submit(submission)
    click.echo(f"Job [{job.job_id}] submitted successfully.", err=True)
    if not stream_logs:
        click.echo(_follow_up(job.job_id), err=True)
        click.echo(_summary(job, ("jobId", "state")), nl=False)
        return
    sys.exit(_stream_then_summarize(services, job.job_id))


def _configure_logging(verbosity: str) -> None:
    """gcloud's --verbosity for aiptrain's own loggers: messages go to stderr as `DEBUG: ...`."""
    if verbosity == "warning":
        return  # the default: aiptrain says nothing below a warning, and logs none itself
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logger = logging.getLogger("aiptrain")
    logger.addHandler(handler)
    logger.setLevel(logging.CRITICAL + 1 if verbosity == "none" else verbosity.upper())


def _stream_then_summarize(services: Services, job_id: str) -> int:
    try:
        _print_logs(services, job_id, task_name=None, allow_multiline=False, err=True)
    except KeyboardInterrupt:
        click.echo("Received keyboard interrupt.\n", err=True)
        click.echo(_follow_up(job_id), err=True)
        return EXIT_INTERRUPTED
    from aiptrain.model import State

    job = services.job(job_id)
    click.echo(_summary(job), nl=False)
    return EXIT_OK if job.state is State.SUCCEEDED else EXIT_JOB_FAILED


def _print_logs(services: Services, job_id: str, task_name, allow_multiline: bool, err: bool,
                poll_seconds: float = 0.2) -> None:
    from aiptrain import logs

    services.job(job_id)  # exists? reconciled.

    def finished() -> bool:
        return services.job(job_id).state.is_terminal

    path = services.settings.job_log_path(job_id)
    for batch in logs.follow(path, finished, poll_seconds, task=task_name):
        lines = [line for record in batch for line in logs.format_record(record, allow_multiline)]
        click.echo("\n".join(lines), err=err)  # one write per batch: thousands of lines a second


@jobs.command()
@click.argument("job_id", metavar="JOB")
def describe(job_id) -> None:
    """Print a job as the REST resource (YAML, camelCase)."""
    job = Services().job(job_id)
    click.echo(_yaml(job.to_resource()), nl=False)
    click.echo(f"\nView the logs with:\n  $ aiptrain jobs stream-logs {job_id}", err=True)


@jobs.command(name="list")
@click.option("--limit", type=click.IntRange(min=1), help="Show at most this many jobs (newest first).")
@click.option("--filter", "filter_", help="Simple filters: `jobId:prefix*`, `state:FAILED`, joined with AND.")
def list_(limit, filter_) -> None:
    """List jobs, newest first: JOB_ID, STATUS, CREATED."""
    from aiptrain.jobs import reconcile_all

    services = Services()
    reconcile_all(services.settings, services.store, services.backend_factory)
    found = [job for job in services.store.list() if _matches(job, filter_)]
    if limit:
        found = found[:limit]
    if not found:
        click.echo("Listed 0 items.", err=True)
        return
    from aiptrain.cli.output import print_table

    rows = [(job.job_id, job.state.value, _local_time(job.create_time)) for job in found]
    print_table(("JOB_ID", "STATUS", "CREATED"), rows)


def _local_time(moment) -> str:
    return moment.astimezone().strftime("%Y-%m-%dT%H:%M:%S") if moment else ""


def _matches(job, expression: str | None) -> bool:
    """A subset of gcloud's --filter: `field:value` terms (trailing * = prefix) joined by AND."""
    if not expression:
        return True
    resource = job.to_resource()
    for term in expression.replace(" and ", " AND ").split(" AND "):
        key, sep, wanted = term.strip().partition(":")
        if not sep:
            raise click.BadParameter(f"[{term}] is not FIELD:VALUE", param_hint="--filter")
        value = str(resource.get(key.strip(), ""))
        wanted = wanted.strip().strip("'\"")
        if not (value.startswith(wanted[:-1]) if wanted.endswith("*") else value == wanted):
            return False
    return True


@jobs.command(name="stream-logs")
@click.argument("job_id", metavar="JOB")
@click.option("--task-name", help="Show only this task, e.g. master-replica-0.")
@click.option("--allow-multiline-logs", is_flag=True, help="Print multi-line messages as one record.")
@click.option("--polling-interval", type=click.IntRange(min=1), default=1, show_default=True,
              help="Seconds between checks for new lines when none came.")
def stream_logs(job_id, task_name, allow_multiline_logs, polling_interval) -> None:
    """Stream a job's logs until it ends (Ctrl-C stops the stream, not the job)."""
    services = Services()
    try:
        _print_logs(services, job_id, task_name, allow_multiline_logs, err=False,
                    poll_seconds=min(polling_interval, 1) / 5)
    except KeyboardInterrupt:
        click.echo("Received keyboard interrupt.", err=True)


@jobs.command()
@click.argument("job_id", metavar="JOB")
def cancel(job_id) -> None:
    """Cancel a job; a job that already ended is left as it is (exit 0)."""
    from aiptrain.jobs import cancel as cancel_job

    services = Services()
    cancel_job(job_id, services.settings, services.store, services.backend_factory)

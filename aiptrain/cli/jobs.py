"""`aiptrain jobs ...`: the verbs of `gcloud ai-platform jobs`, with gcloud's flags,
messages and exit statuses (reference: aiplatform.md §1, §2, §7)."""

from __future__ import annotations

import os
import sys

import click

from aiptrain.errors import EXIT_INTERRUPTED, EXIT_JOB_FAILED, EXIT_OK
from aiptrain.settings import BACKEND_NAMES, Settings, gcloud_property


def _client():
    """The façade every verb goes through: aiptrain.Client, or in client mode (AIPTRAIN_API)
    aiptrain.remote.ApiClient, with the same methods."""
    from aiptrain.client import open_client

    return open_client(project=_global_flags().project)


def _complete_job_ids(ctx, param, incomplete: str):
    """Shell completion of JOB: the IDs in the store that start with what was typed. (No click
    context is current while click completes: the global flags are not read.)"""
    from aiptrain.client import open_client

    try:
        with open_client() as client:
            return client.job_ids(incomplete)
    except Exception:  # noqa: BLE001 - completion must never print a traceback into the shell
        return []


def _yaml(data) -> str:
    from aiptrain.cli.formats import dump_yaml

    return dump_yaml(data)


def _summary(resource: dict, fields=("endTime", "jobId", "startTime", "state")) -> str:
    return _yaml({k: resource[k] for k in fields if k in resource})


def _global_flags():
    """gcloud's global flags of this invocation (taken out of argv by aiptrain.cli.gcloud)."""
    from aiptrain.cli.gcloud import GlobalFlags

    return click.get_current_context().find_object(GlobalFlags) or GlobalFlags()


def _echo_formatted(data, default) -> None:
    """`data` in the --format asked for, or as `default(data)` renders it."""
    spec = _global_flags().format
    if spec:
        from aiptrain.cli.formats import render

        click.echo(render(data, spec), nl=False)
    else:
        click.echo(default(data), nl=False)


def _follow_up(job_id: str) -> str:
    return (
        "Your job is still active. You may view the status of your job with the command\n\n"
        f"  $ aiptrain jobs describe {job_id}\n\n"
        "or continue streaming the logs with the command\n\n"
        f"  $ aiptrain jobs stream-logs {job_id}"
    )


def _labels(value: str | None, flag: str = "--labels") -> dict[str, str] | None:
    if value is None:
        return None
    labels = {}
    for item in filter(None, value.split(",")):
        key, sep, val = item.partition("=")
        if not sep:
            raise click.BadParameter(f"[{item}] is not KEY=VALUE", param_hint=flag)
        labels[key] = val
    return labels


def _kms_key_name(flags) -> str | None:
    """gcloud's resource argument: a full key name, or an ID completed by the other --kms-* flags."""
    if not flags.kms_key or flags.kms_key.startswith("projects/"):
        return flags.kms_key
    project = flags.kms_project or flags.project
    if not (project and flags.kms_location and flags.kms_keyring):
        raise click.UsageError("Encryption key not fully specified.")
    return f"projects/{project}/locations/{flags.kms_location}/keyRings/{flags.kms_keyring}/cryptoKeys/{flags.kms_key}"


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
@click.argument("job_id", metavar="JOB", shell_complete=_complete_job_ids)
@click.argument("user_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- USER_ARGS...]")
@click.option("--config", help="YAML or JSON file holding a Job resource (trainingInput: ...).")
@click.option("--job-dir", help="Directory (local path, file:// or gs://) for the job's output; passed as --job-dir.")
@click.option("--labels", help="KEY=VALUE,... labels for the job.")
@click.option("--module-name", help="Python module to run, e.g. trainer.task.")
@click.option("--package-path", help="Local directory of the Python package to build and stage.")
@click.option("--packages", multiple=True, help="Extra packages, comma-separated: local files or gs:// URLs.")
@click.option("--staging-bucket", help="Bucket for staged packages: a directory, file:// or gs:// URL.")
@click.option("--region", help="Region recorded on the job (default: the config's, else $CLOUDSDK_COMPUTE_REGION, "
              "else us-central1; gcloud 528 requires this or the property).")
@click.option("--scale-tier", help="basic, standard-1, premium-1, basic-gpu or custom.")
@click.option("--runtime-version", help="Runtime version (image) to run the trainer in; see `aiptrain runtimes list`.")
@click.option("--python-version", help="Recorded on the job; the runtime image decides the Python.")
@click.option("--master-machine-type", help="Machine type of the master (with --scale-tier custom: this or the "
              "config's masterType; gcloud 528 requires the flag).")
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
@click.option("--kms-key", help="Recorded as encryptionConfig.kmsKeyName; nothing is encrypted here.")
@click.option("--kms-keyring", help="With --kms-key as a bare ID.")
@click.option("--kms-location", help="With --kms-key as a bare ID.")
@click.option("--kms-project", help="With --kms-key as a bare ID (default: --project).")
@click.option("--network", help="(beta) Recorded on the job; replicas share the job's own Docker network.")
@click.option("--tpu-tf-version", help="(beta) Refused: TPUs cannot be emulated.")
@click.option("--async", "async_", is_flag=True, help="Deprecated: submitting is asynchronous by default.")
@click.option("--stream-logs", is_flag=True, help="Stream the logs until the job ends; exit 1 unless it succeeded.")
@click.option("--limit-resources", is_flag=True, envvar="AIPTRAIN_LIMIT_RESOURCES",
              help="Limit each replica to its machine type's vCPUs and memory, scaled so the job fits this host.")
@click.option("--backend", type=click.Choice(BACKEND_NAMES), default=None,
              help="What runs the replicas: one Docker engine, or a Docker Swarm (default: AIPTRAIN_BACKEND, else docker).")
@click.option("--dry-run", is_flag=True, help="Print the launch plan (every container) and do nothing else.")
def training(job_id, user_args, config, labels, packages, async_, stream_logs, dry_run, **flags) -> None:
    """Submit a training job, as `gcloud ai-platform jobs submit training`."""
    from aiptrain.config import SubmitFlags
    from aiptrain.exports import dry_run_plan

    if async_ and stream_logs:
        raise click.UsageError("argument --async: At most one of --async | --stream-logs may be specified.")
    if async_:
        click.echo(
            "WARNING: The --async flag is deprecated, as the default behavior is to submit the job "
            "asynchronously; it can be omitted. For synchronous behavior, please pass --stream-logs.",
            err=True,
        )
    if _asks_for_vertex(_global_flags().format):
        raise click.UsageError("--format vertex prints a job as a Vertex AI job: convert the command line with "
                               "`aiptrain jobs convert --config FILE [flags]`, or a submitted job with "
                               "`aiptrain jobs export JOB --format vertex`.")
    manifests = _manifest_format()
    if manifests and not dry_run:
        raise click.UsageError(f"--format {manifests.kind} prints the job as Kubeflow manifests instead of submitting "
                               "it: add --dry-run, or export a submitted job with `aiptrain jobs export JOB`.")
    client = _client()
    submit_flags = SubmitFlags(
        job_id=job_id, config=config, labels=_labels(labels), packages=_packages(packages),
        user_args=list(user_args), project=_global_flags().project or gcloud_property("core/project"), **flags,
    )
    submit_flags.kms_key = _kms_key_name(submit_flags)
    submission = client.prepare(submit_flags)
    if submission.runtime and submission.runtime.note:
        click.echo(submission.runtime.note, err=True)
    if dry_run:
        _warn(submission.notices)
        if manifests and manifests.kind == "tfjob":
            _print_manifests(client.dry_run_tfjob(submission))
        elif manifests:
            _print_manifests(client.dry_run_trainjob(submission, _trainjob_runtime(manifests)))
        else:
            _echo_formatted(dry_run_plan(submission).to_dict(), _yaml)
        return
    from aiptrain.cli.output import spinner

    with spinner() as report:
        # A runtime image built on demand: its steps on the spinner, or as lines in a log.
        build_progress = report if sys.stderr.isatty() else (lambda line: click.echo(line, err=True))
        job = client.submit(submission, report, build_progress)
    _warn(submission.notices)  # after the job exists: a refused submit says one line, its error
    click.echo(f"Job [{job.job_id}] submitted successfully.", err=True)
    if not stream_logs:
        click.echo(_follow_up(job.job_id), err=True)
        _echo_formatted(job.to_resource(), lambda resource: _summary(resource, ("jobId", "state")))
        return
    sys.exit(_stream_then_summarize(client, job.job_id))


def _manifest_format():
    """The --format when it asks for Kubeflow manifests (trainjob, tfjob), else None."""
    from aiptrain.cli.formats import manifest_format

    return manifest_format(_global_flags().format)


def _trainjob_runtime(manifests):
    from aiptrain.trainjob import Runtime

    return Runtime(manifests.runtime or Runtime.AUTO.value) if manifests else Runtime.AUTO


def _print_manifests(export) -> None:
    """The manifests on stdout as YAML documents, in the order to apply them (notes for the
    person applying them as comments on top), warnings on stderr."""
    _warn(export.warnings)
    click.echo(export.comment() + "---\n".join(_yaml(document) for document in export.documents()), nl=False)


def _warn(notices) -> None:
    """Warnings about the submission, unless --verbosity asks for errors only."""
    if _global_flags().verbosity not in ("error", "critical", "none"):
        for notice in notices:
            click.echo(f"WARNING: {notice}", err=True)


def _stream_then_summarize(client, job_id: str) -> int:
    try:
        _print_logs(client, job_id, task_name=None, allow_multiline=False, err=True)
    except KeyboardInterrupt:
        click.echo("Received keyboard interrupt.\n", err=True)
        click.echo(_follow_up(job_id), err=True)
        return EXIT_INTERRUPTED
    from aiptrain.model import State

    job = client.get(job_id)
    _echo_formatted(job.to_resource(), _summary)
    return EXIT_OK if job.state is State.SUCCEEDED else EXIT_JOB_FAILED


def _print_logs(client, job_id: str, task_name, allow_multiline: bool, err: bool,
                poll_seconds: float = 0.2) -> None:
    if _live_view_wanted(err):
        from aiptrain.cli.live import print_live

        return print_live(client, job_id, task_name, allow_multiline, err, poll_seconds)
    from aiptrain import logs

    # A terminal gets control characters escaped; a pipe gets the trainer's bytes as they were.
    escape = (sys.stderr if err else sys.stdout).isatty()
    for block in client.log_blocks(job_id, poll_seconds):
        text = logs.format_lines(block, allow_multiline, task_name)
        if text:  # one write per block: a million lines a minute. color=True: click must not strip ESC.
            click.echo(logs.printable(text) if escape else text, err=err, color=True)


def _live_view_wanted(err: bool) -> bool:
    """Colours and a status line on a terminal; gcloud's plain lines through a pipe, in CI, or
    with NO_COLOR / TERM=dumb."""
    stream = sys.stderr if err else sys.stdout
    if not stream.isatty() or os.environ.get("CI") or os.environ.get("NO_COLOR") is not None:
        return False
    return os.environ.get("TERM", "") != "dumb"


@jobs.command()
@click.argument("job_id", metavar="JOB", shell_complete=_complete_job_ids)
@click.option("--summarize", is_flag=True,
              help="Print gcloud's summary tables (overview, input, output, HP trials) instead of the resource.")
def describe(job_id, summarize) -> None:
    """Print a job as the REST resource (YAML, camelCase)."""
    client = _client()
    job = client.get(job_id)
    if summarize:
        from aiptrain.cli.summary import print_summary

        if _global_flags().format:
            click.echo("WARNING: --format is ignored when --summarize is present", err=True)
        print_summary(job)
    else:
        _echo_formatted(job.to_resource(), _yaml)
    if client.local_gcs_root:
        _say_where_gcs_paths_are(job, client.local_gcs_root)
    if job.job_position:
        reason = client.waiting_reason(job_id) or "Waiting for the machine to have room for it."
        click.echo(f"\nQueued (position {job.job_position}): {reason}", err=True)
    click.echo(f"\nView the logs with:\n  $ aiptrain jobs stream-logs {job_id}", err=True)


def _say_where_gcs_paths_are(job, gcs_root) -> None:
    """The resource keeps the gs:// URLs as given; those kept on this machine are named here."""
    from aiptrain.storage import kept_locally

    ti = job.training_input
    found = kept_locally(gcs_root, [url for url in (ti.job_dir, *(ti.package_uris or [])) if url])
    if found:
        lines = "".join(f"\n  {url} -> {path}" for url, path in found)
        click.echo(f"\ngs:// paths kept on this machine (AIPTRAIN_GCS=local):{lines}", err=True)


@jobs.command()
@click.argument("job_id", metavar="JOB", shell_complete=_complete_job_ids)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Image file to write: .png, .svg or .pdf.")
def plot(job_id, output) -> None:
    """Draw a hyperparameter tuning job's trials: objective per trial with the best so far, and
    each parameter against the objective. Needs matplotlib: pip install 'aiptrain[plot]'."""
    from pathlib import Path

    from aiptrain.plot import plot_study

    plot_study(_client().get(job_id), Path(output))
    click.echo(f"Plotted job [{job_id}] to [{output}].", err=True)


@jobs.command()
@click.argument("job_id", metavar="JOB", shell_complete=_complete_job_ids)
def export(job_id) -> None:
    """Print a job as Kubeflow manifests: a Trainer v2 TrainJob and the ClusterTrainingRuntime it
    references (--format trainjob, the default; trainjob[torch] or trainjob[tensorflow] picks the
    runtime), or a legacy TFJob (--format tfjob):
    `aiptrain jobs export JOB > trainjob.yaml && kubectl apply -f trainjob.yaml`. --format vertex
    prints the Vertex AI CustomJob it would be, as `jobs convert JOB` does."""
    spec = _global_flags().format
    if _asks_for_vertex(spec):
        from aiptrain.vertex.convert import to_vertex

        _print_conversion(_recorded_vertex_job(job_id)
                          or to_vertex(_client().get(job_id), Settings().default_runtime_version))
        return
    manifests = _manifest_format()
    if spec and not manifests:
        raise click.UsageError(f"jobs export prints Kubeflow manifests: use --format trainjob (the default) or "
                               f"tfjob (legacy), or vertex for the Vertex AI job it would be, not [{spec}].")
    if manifests and manifests.kind == "tfjob":
        _print_manifests(_client().export_tfjob(job_id))
    else:
        _print_manifests(_client().export_trainjob(job_id, _trainjob_runtime(manifests)))


def _asks_for_vertex(spec: str | None) -> bool:
    from aiptrain.cli.formats import VERTEX, parse_format

    if not spec:
        return False
    return parse_format(spec).kind == VERTEX


def _print_conversion(conversion, gcloud_config: bool = False) -> None:
    from aiptrain.cli.convert import print_conversion

    spec = _global_flags().format
    print_conversion(conversion, None if _asks_for_vertex(spec) else spec, gcloud_config, _global_flags().verbosity,
                     Settings().default_region)


class _TrainerArgsCommand(click.Command):
    """A command whose JOB is optional: the trainer's args after `--` are set apart before click
    parses the rest (click would give the first of them to JOB)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            ctx.meta["aiptrain.user_args"] = args[at + 1:]
            args = args[:at]
        return super().parse_args(ctx, args)


@jobs.command(cls=_TrainerArgsCommand, epilog="Arguments after `--` are the trainer's (with --config).")
@click.argument("job_id", metavar="[JOB]", required=False, shell_complete=_complete_job_ids)
@click.option("--config", help="A gcloud --config file (a Job resource, YAML or JSON) to convert, with the submit "
              "flags below merged over it as `jobs submit training` merges them.")
@click.option("--from-file", help="A Vertex AI CustomJob, CustomJobSpec or HyperparameterTuningJob (YAML or JSON) "
              "to convert to an AI Platform job.")
@click.option("--to", "target", type=click.Choice(["vertex", "ai-platform"]),
              help="Which way: vertex for JOB and --config, ai-platform for --from-file (the default each way).")
@click.option("--display-name", help="The converted job's displayName (--to vertex; default: the job ID, the "
              "config's jobId or the file's name) or jobId (--to ai-platform; default: from the displayName).")
@click.option("--gcloud-config", is_flag=True, help="Print what `gcloud ai custom-jobs create --config` takes "
              "(the CustomJob's jobSpec) instead of the REST resource.")
@click.option("--module-name", help="As for `jobs submit training`, with --config.")
@click.option("--packages", multiple=True, help="gs:// URLs of the trainer's packages, comma-separated, with --config.")
@click.option("--runtime-version", help="As for `jobs submit training`, with --config: names the executor image.")
@click.option("--region", help="The region, the Vertex AI location (with --config or --from-file).")
@click.option("--scale-tier", help="As for `jobs submit training`, with --config: written out as worker pools.")
@click.option("--master-image-uri", help="As for `jobs submit training`, with --config: a containerSpec.")
@click.option("--job-dir", help="As for `jobs submit training`, with --config: the baseOutputDirectory.")
@click.option("--labels", help="KEY=VALUE,... labels, with --config.")
def convert(job_id, config, from_file, target, display_name, gcloud_config, packages, labels, region,
            **flags) -> None:
    """Convert between an AI Platform job and the Vertex AI job it would be: a stored JOB or a
    --config (with submit flags) to a CustomJob, or a HyperparameterTuningJob when it tunes;
    --from-file with a Vertex AI job to the AI Platform job (what `jobs submit training --config`
    takes). The job goes to stdout (YAML, or --format json), what has no equivalent to stderr, one
    NOTE a line. Nothing is created."""
    ctx = click.get_current_context()
    user_args = ctx.meta.get("aiptrain.user_args", [])
    sources = [name for name, given in (("JOB", job_id), ("--config", config), ("--from-file", from_file)) if given]
    if len(sources) != 1:
        raise click.UsageError("Give one of JOB (a job in the store), --config FILE or --from-file FILE"
                               + (f", not {' and '.join(sources)}." if sources else "."))
    wanted = "ai-platform" if from_file else "vertex"
    if target and target != wanted:
        raise click.UsageError(f"{sources[0]} converts --to {wanted} only: an AI Platform job becomes a Vertex AI job, "
                               "a Vertex AI job (--from-file) an AI Platform job.")
    only_config = [f"--{name.replace('_', '-')}" for name, value in
                   (*flags.items(), ("packages", packages), ("labels", labels)) if value]
    only_config += ["-- ARGS"] if user_args else []
    if only_config and not config:
        raise click.UsageError(f"{only_config[0]} goes with --config: a stored job or a Vertex AI file is converted "
                               "as it is.")
    if region and job_id:
        raise click.UsageError("--region goes with --config or --from-file: a stored job has its own region.")
    if from_file:
        conversion = _from_vertex_file(from_file, display_name, region)
    else:
        from aiptrain.vertex.convert import to_vertex

        conversion = _recorded_vertex_job(job_id) if job_id and not display_name else None
        if conversion is None:
            job = _client().get(job_id) if job_id else _job_of_config(config, display_name, region, packages, labels,
                                                                      user_args, flags)
            if display_name:
                job = job.model_copy(update={"job_id": display_name})
            conversion = to_vertex(job, Settings().default_runtime_version)
    _print_conversion(conversion, gcloud_config)


def _recorded_vertex_job(job_id: str):
    from aiptrain.cli.convert import recorded_vertex_job

    with _client() as client:
        client.get(job_id)  # JobNotFound first, as for any job
        return recorded_vertex_job(client, job_id)


def _job_of_config(config, display_name, region, packages, labels, user_args, flags):
    """The Job that `jobs submit training` would build from --config and the flags (gcloud's merge rule)."""
    from pathlib import Path

    from aiptrain.config import SubmitFlags, build_job, load_config

    base = load_config(config)
    name = display_name or base.job_id or Path(config).stem
    job = build_job(SubmitFlags(job_id=name, config=config, labels=_labels(labels), region=region,
                                user_args=list(user_args), **flags), base=base)
    if packages:
        job.training_input.package_uris = _packages(packages)
    return job


def _from_vertex_file(path: str, display_name: str | None, region: str | None):
    from pathlib import Path

    from aiptrain.config import read_document
    from aiptrain.runtimes import mapped
    from aiptrain.vertex.convert import to_ai_platform

    data = read_document(path, "--from-file")
    if display_name and isinstance(data, dict) and "workerPoolSpecs" not in data:  # a CustomJobSpec has no name
        data = {**data, "displayName": display_name}
    return to_ai_platform(data, path, display_name or Path(path).stem, region, mapped(Settings().home))


LIST_FORMAT = "table(jobId.basename(), state:label=STATUS, createTime.date(tz=LOCAL):label=CREATED)"


@jobs.command(name="list")
@click.option("--filter", "filter_", metavar="EXPRESSION",
              help="gcloud's filter expression, e.g. `jobId:census* AND state:FAILED`, `labels.team=ml`, "
                   "`createTime>2026-01-01`, `state:(RUNNING QUEUED)`, with AND, OR, NOT and parentheses.")
@click.option("--limit", type=click.IntRange(min=1), help="Show at most this many jobs (after sorting and filtering).")
@click.option("--page-size", type=click.IntRange(min=1),
              help="Accepted for gcloud's scripts: there are no pages here, every job is printed at once.")
@click.option("--sort-by", metavar="[FIELD,...]", help="Sort by these fields, `~` for descending "
              "(default: newest first).")
@click.option("--uri", is_flag=True, help="Print each job's REST URI instead (project: --project, else "
              "$CLOUDSDK_CORE_PROJECT, else `aiptrain`).")
def list_(filter_, limit, page_size, sort_by, uri) -> None:
    """List the project's jobs, newest first: JOB_ID, STATUS, CREATED."""
    from aiptrain.cli.formats import parse_format, render

    spec = _global_flags().format or LIST_FORMAT
    found = _list_resources(filter_, sort_by, limit, ["jobId"] if uri else parse_format(spec).fields or None)
    if uri:
        client = _client()
        text = "".join(client.uri(resource["jobId"], _global_flags().project) + "\n" for resource in found)
    else:
        text = render(found, spec)
    if text:
        click.echo(text, nl=False)
    else:
        click.echo("Listed 0 items.", err=True)


def _list_resources(filter_, sort_by, limit, fields) -> list[dict]:
    """Around the Client façade, which imports pydantic and the engine's client: a table of jobs
    needs neither (aiptrain.listing; Client.list goes through it too)."""
    from aiptrain import listing

    settings = Settings()
    if settings.api_url:  # client mode: the server lists (the façade is imported in any case then)
        with _client() as client:
            return client.list_resources(filter_, sort_by, limit, fields)
    return listing.list_resources(settings, filter_, sort_by, limit, fields, project=_global_flags().project)


@jobs.command()
@click.argument("job_id", metavar="JOB", shell_complete=_complete_job_ids)
@click.option("--update-labels", metavar="KEY=VALUE,...", help="Labels to add or change.")
@click.option("--remove-labels", metavar="KEY,...", help="Labels to remove; absent keys are ignored.")
@click.option("--clear-labels", is_flag=True, help="Remove every label (applied before --update-labels).")
def update(job_id, update_labels, remove_labels, clear_labels) -> None:
    """Update a job's labels, as `gcloud ai-platform jobs update`: --clear-labels, then
    --update-labels, then --remove-labels. Finished jobs can be relabelled too."""
    if clear_labels and remove_labels is not None:
        raise click.UsageError("argument --clear-labels: At most one of --clear-labels | --remove-labels may be specified.")
    if update_labels is None and remove_labels is None and not clear_labels:
        raise click.UsageError("No updates requested.")
    remove = [key for key in (remove_labels or "").split(",") if key]
    result = _client().update_labels(job_id, _labels(update_labels, "--update-labels"), remove, clear_labels)
    if not result.changed:
        click.echo("No update to perform.", err=True)
        return
    click.echo(f"Updated ml engine job [{job_id}].", err=True)


@jobs.command(name="stream-logs")
@click.argument("job_id", metavar="JOB", shell_complete=_complete_job_ids)
@click.option("--task-name", help="Show only this task, e.g. master-replica-0.")
@click.option("--allow-multiline-logs", is_flag=True, help="Print multi-line messages as one record.")
@click.option("--polling-interval", type=click.IntRange(min=1), default=1, show_default=True,
              help="Seconds between checks for new lines when none came.")
def stream_logs(job_id, task_name, allow_multiline_logs, polling_interval) -> None:
    """Stream a job's logs until it ends (Ctrl-C stops the stream, not the job)."""
    client = _client()
    try:
        _print_logs(client, job_id, task_name, allow_multiline_logs, err=False,
                    poll_seconds=min(polling_interval, 1) / 5)
    except KeyboardInterrupt:
        click.echo("Received keyboard interrupt.", err=True)


@jobs.command()
@click.argument("job_id", metavar="JOB", shell_complete=_complete_job_ids)
def cancel(job_id) -> None:
    """Cancel a job; a job that already ended is left as it is (exit 0)."""
    _client().cancel(job_id)

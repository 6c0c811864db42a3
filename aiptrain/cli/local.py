"""`aiptrain local train`: gcloud's `ai-platform local train`, processes on this machine; `aiptrain local
run`: gcloud's `ai custom-jobs local-run`, a Vertex AI CustomJob built and run on this machine's engine."""

from __future__ import annotations

import sys

import click


@click.group()
def local() -> None:
    """Run a trainer on this machine: as processes, without Docker (`local train`, gcloud's `ai-platform
    local train`), or as a Vertex AI custom job on the Docker engine (`local run`, gcloud's `ai custom-jobs
    local-run`)."""


@local.command(context_settings={"ignore_unknown_options": False})
@click.option("--module-name", required=True, help="The module to run, as `python -m MODULE`.")
@click.option("--package-path", type=click.Path(), default=None,
              help="The trainer package's directory (default: the current one). Processes run in its parent.")
@click.option("--job-dir", default=None, help="Passed on to the trainer as `--job-dir DIR`, after the user args.")
@click.option("--distributed", is_flag=True, help="Run a local cluster: ps, workers, evaluators and the primary.")
@click.option("--worker-count", type=int, default=None, help="Workers with --distributed. Default: 2.")
@click.option("--parameter-server-count", type=int, default=None,
              help="Parameter servers with --distributed. Default: 2.")
@click.option("--evaluator-count", type=int, default=None, help="Evaluators with --distributed. Default: 0.")
@click.option("--start-port", type=int, default=27182, show_default=True,
              help="First of the cluster's ports (parameter-server-count + worker-count + 1 in a row).")
@click.argument("user_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- USER_ARGS...]")
def train(module_name, package_path, job_dir, distributed, worker_count, parameter_server_count,
          evaluator_count, start_port, user_args) -> None:
    """Run MODULE here as AI Platform would run it, with TF_CONFIG set.

    \b
    The Python is $AIPTRAIN_LOCAL_PYTHON, else $CLOUDSDK_ML_ENGINE_LOCAL_PYTHON, else `python`
    on PATH, else the one running aiptrain. With --distributed, each output line starts with
    its task (`worker-replica-0: ...`). The exit status is the primary's.
    """
    import os

    from aiptrain.local_train import LocalTrainArgs, run

    args = LocalTrainArgs(
        module_name=module_name,
        package_path=os.path.abspath(package_path or os.getcwd()),
        user_args=tuple(user_args),
        job_dir=job_dir,
        distributed=distributed,
        worker_count=worker_count,
        parameter_server_count=parameter_server_count,
        evaluator_count=evaluator_count,
        start_port=start_port,
    )
    sys.stdout.flush()
    code = run(args, warn=lambda message: click.echo(f"WARNING: {message}", err=True))
    sys.exit(code)


def _listed(values: tuple[str, ...]) -> tuple[str, ...]:
    """A list flag as gcloud takes it: comma-separated, and repeatable."""
    return tuple(item.strip() for value in values for item in value.split(",") if item.strip())


@local.command(context_settings={"ignore_unknown_options": False})
@click.option("--executor-image-uri", required=True,
              help="The image that runs the application: a Vertex AI prebuilt training image (run as the runtime "
                   "image holding its frameworks) or an image on this Docker engine.")
@click.option("--local-package-path", type=click.Path(), default=None,
              help="The work dir: where the script or module is (default: the current directory).")
@click.option("--python-module", help="The module to run, e.g. trainer.task, relative to the work dir.")
@click.option("--script", help="The file to run (Python or a shell script), relative to the work dir.")
@click.option("--requirements", multiple=True, help="Requirements to install, comma-separated (e.g. pandas==2.2).")
@click.option("--extra-packages", multiple=True, help="Packages (sdists, wheels) under the work dir to install.")
@click.option("--extra-dirs", multiple=True, help="Directories under the work dir to copy into the image too.")
@click.option("--output-image-uri", help="The name of the image built (default: aiptrain-local-run/SCRIPT:DIGEST).")
@click.option("--gpu", is_flag=True, help="Give the replicas a GPU (the engine must have one).")
@click.option("--service-account-key-file", type=click.Path(), default=None,
              help="A service account key the replicas use for Google Cloud (with AIPTRAIN_GCS=remote).")
@click.option("--worker-count", type=int, default=0, show_default=True,
              help="Workers beside the primary (workerPoolSpecs[1]): a local cluster with CLUSTER_SPEC and TF_CONFIG.")
@click.option("--base-output-dir", help="baseOutputDirectory: a gs:// prefix that sets AIP_MODEL_DIR, "
                                        "AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR.")
@click.option("--display-name", help="The customJob's displayName (default: local-run-SCRIPT).")
@click.argument("user_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- USER_ARGS...]")
def run(executor_image_uri, local_package_path, python_module, script, requirements, extra_packages, extra_dirs,
        output_image_uri, gpu, service_account_key_file, worker_count, base_output_dir, display_name,
        user_args) -> None:
    """Run a custom training job here as Vertex AI runs it (gcloud's `ai custom-jobs local-run`).

    \b
    With --script or --python-module the work dir is built into an image FROM the executor
    image (requirements resolved on this host; nothing rebuilt when nothing changed); without
    them the executor image runs as it is. The job runs through the controller with Vertex
    AI's replica contract (CLUSTER_SPEC, TF_CONFIG, AIP_*_DIR, /gcs) and is recorded as a
    customJob. The exit status is 0 when it succeeded, 1 when it failed.
    """
    import os

    from aiptrain.cli.jobs import _global_flags, _print_logs, _warn
    from aiptrain.client import Client
    from aiptrain.errors import EXIT_JOB_FAILED, EXIT_OK
    from aiptrain.model import State
    from aiptrain.settings import gcloud_property
    from aiptrain.vertex.local_run import LocalRunArgs, prepare_image, submit, validate
    from aiptrain.vertex.translate import vertex_message

    if python_module and script:
        raise click.UsageError("argument --python-module: At most one of --python-module | --script may be specified.")
    args = LocalRunArgs(
        executor_image_uri=executor_image_uri,
        local_package_path=os.path.abspath(os.path.expanduser(local_package_path or os.getcwd())),
        python_module=python_module, script=script, requirements=_listed(requirements),
        extra_packages=_listed(extra_packages), extra_dirs=_listed(extra_dirs), output_image_uri=output_image_uri,
        gpu=gpu, service_account_key_file=service_account_key_file, user_args=tuple(user_args),
        worker_count=worker_count, base_output_dir=base_output_dir, display_name=display_name,
    )
    validate(args)

    def say(line: str) -> None:
        click.echo(line, err=True)

    say(f"Package is set to {args.local_package_path}.")
    with Client(project=_global_flags().project or gcloud_property("core/project")) as client:
        image = prepare_image(args, client.settings, say)
        say("Starting to run ...")
        started, notices = submit(args, image, client, lambda step: None)
        _warn(notices)
        say(f"Custom Job [{started.name}] is running as job [{started.job_id}].")
        _print_logs(client, started.job_id, task_name=None, allow_multiline=False, err=True)
        job = client.get(started.job_id)
    if job.state is State.SUCCEEDED:
        click.echo(f"A local run is finished successfully using custom image: {image}.")
        sys.exit(EXIT_OK)
    state = job.state.value if job.state else "UNKNOWN"
    say(f"ERROR: The local run ended {state}: {vertex_message(job.error_message or '')}".rstrip(": "))
    sys.exit(EXIT_JOB_FAILED)

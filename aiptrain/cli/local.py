"""`aiptrain local train`: gcloud's `ai-platform local train`, processes on this machine."""

from __future__ import annotations

import sys

import click


@click.group()
def local() -> None:
    """Run a trainer on this machine, without Docker (gcloud's `local train`)."""


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

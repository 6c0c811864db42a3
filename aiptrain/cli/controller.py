"""`aiptrain controller run|status|stop`: the home's one process that drives every job."""

from __future__ import annotations

import click


@click.group()
def controller() -> None:
    """The process that drives this home's jobs (started on demand by any command that needs it)."""


@controller.command()
def run() -> None:
    """Drive this home's jobs in the foreground until stopped (SIGTERM, Ctrl-C or `controller stop`).

    For a service manager (systemd, a Swarm service): started this way it never exits for lack
    of work. Without it, `jobs submit` starts a controller in the background, which exits after
    AIPTRAIN_CONTROLLER_IDLE_SECONDS with no active job.
    """
    import logging

    from aiptrain.errors import EnvironmentNotReady
    from aiptrain.ownership import JobLock
    from aiptrain.runner import control
    from aiptrain.runner.controller import serve
    from aiptrain.settings import Settings

    settings = Settings()
    settings.ensure_dirs()
    lock = JobLock.try_acquire(settings.controller_lock_path)
    if lock is None:
        info = control.running(settings)
        raise EnvironmentNotReady(
            f"A controller already drives the jobs of {settings.home} (PID {info.pid if info else '?'}): "
            "stop it first with `aiptrain controller stop`, or use another AIPTRAIN_HOME."
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    serve(settings, lock, idle_exit=False)


@controller.command()
def status() -> None:
    """Whether a controller runs for this home: its PID, version and start time, and how many jobs are active."""
    from aiptrain.jobtable import JobTable
    from aiptrain.runner import control
    from aiptrain.settings import Settings

    settings = Settings()
    info = control.running(settings)
    active = 0
    if settings.store_url or settings.store_path.exists():
        with JobTable.of(settings) as table:
            active = len(table.active_job_ids())
    jobs = f"{active} active job{'s' * (active != 1)}"
    if info is None:
        click.echo(f"No controller runs for {settings.home} ({jobs}; the next command that needs one starts it).")
        return
    current = "current" if info.version == control.code_version() else "outdated: the next command replaces it"
    click.echo(f"Controller PID {info.pid} for {settings.home}, started {info.started}, version {info.version} "
               f"({current}); {jobs}.")


@controller.command()
@click.option("--timeout", type=click.FloatRange(min=0), default=60, show_default=True,
              help="Seconds to wait for it to finish the steps in hand.")
def stop(timeout: float) -> None:
    """Stop this home's controller. Jobs keep running; the next command that needs it starts one."""
    from aiptrain.errors import EnvironmentNotReady
    from aiptrain.runner import control
    from aiptrain.settings import Settings

    if not control.stop(Settings(), timeout):
        raise EnvironmentNotReady(f"The controller did not stop within {timeout:g} s: try again, or send it SIGTERM.")
    click.echo("No controller runs now.")

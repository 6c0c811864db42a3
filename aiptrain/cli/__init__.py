"""The `aiptrain` command line: a thin click layer over aiptrain.submission, aiptrain.jobs
and aiptrain.runtimes.

Only click is imported at start-up; each command imports what it needs when it runs,
so `aiptrain --help` starts about as fast as click itself.
"""

from __future__ import annotations

import sys

import click

from aiptrain.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, AiptrainError, EnvironmentNotReady


class LazyGroup(click.Group):
    """A group whose subcommands live in modules imported only when used."""

    def __init__(self, *args, lazy: dict[str, tuple[str, str, str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}  # name -> (module, attribute, short help)

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx, name):
        if name in self.lazy:
            import importlib

            module, attribute, _ = self.lazy[name]
            return getattr(importlib.import_module(module), attribute)
        return super().get_command(ctx, name)

    def format_commands(self, ctx, formatter):
        rows = [(name, self.lazy[name][2]) for name in sorted(self.lazy)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    lazy={
        "algorithms": ("aiptrain.cli.algorithms", "algorithms",
                       "Build the built-in algorithms' images (gcr.io/cloud-ml-algos/...)."),
        "buckets": ("aiptrain.cli.buckets", "buckets", "List this home's buckets and assign them to projects."),
        "cache": ("aiptrain.cli.cache", "cache", "Prune the cache of packages and wheelhouses."),
        "controller": ("aiptrain.cli.controller", "controller", "Run, inspect or stop the process that drives jobs."),
        "jobs": ("aiptrain.cli.jobs", "jobs", "Submit and manage training jobs."),
        "local": ("aiptrain.cli.local", "local", "Run a trainer on this machine (local train, local run)."),
        "runtimes": ("aiptrain.cli.runtimes", "runtimes", "List and build runtime images."),
        "serve": ("aiptrain.cli.serve", "serve", "Serve the ml v1 REST API and job logs over HTTP."),
        "gcloud-config": ("aiptrain.cli.gcloud_config", "gcloud_config",
                          "Point Google's real gcloud and gsutil at an `aiptrain serve`."),
        "gcloud-shim": ("aiptrain.cli.shim", "gcloud_shim", "Install a `gcloud` that forwards ai-platform commands here."),
    },
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="aiptrain")
def cli() -> None:
    """Google AI Platform Training's job model on your own machines.

    Scripts written for `gcloud ai-platform jobs ...` work with `aiptrain jobs ...`.

    \b
    gcloud's prefixes reach the same commands:
      aiptrain [beta|alpha] ai-platform|ml-engine jobs ...
    and its global flags work anywhere before `--`: --project, --format,
    --verbosity, --quiet/-q, --configuration, --account, --billing-project,
    --impersonate-service-account, --log-http, --user-output-enabled, --trace-token.

    \b
    Exit status: 0 success; 1 the job failed or was cancelled (when waiting on it);
    2 usage or validation error; 3 environment not ready (Docker, images, GPUs);
    4 aiptrain failed; 130 interrupted.
    """


def main(argv: list[str] | None = None) -> None:
    from aiptrain.cli.gcloud import GcloudUsageError, normalize

    try:
        argv, global_flags = normalize(sys.argv[1:] if argv is None else list(argv))
    except GcloudUsageError as exc:
        click.echo(f"ERROR: (aiptrain) {_printable(str(exc))}", err=True)
        sys.exit(EXIT_USAGE)
    configure_logging(global_flags.verbosity)
    for line in global_flags.without_local_effect():
        import logging

        logging.getLogger("aiptrain.cli").info(line)
    try:
        if global_flags.format:
            from aiptrain.cli.formats import parse

            parse(global_flags.format)  # refused before the command runs, not after a job started
        code = cli.main(args=argv, prog_name="aiptrain", standalone_mode=False, obj=global_flags)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        code = EXIT_INTERRUPTED
    except click.ClickException as exc:
        _show_click_error(exc)
        code = exc.exit_code
    except AiptrainError as exc:
        click.echo(f"ERROR: {_printable(str(exc))}", err=True)
        code = exc.exit_code
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        code = EXIT_INTERRUPTED
    except Exception as exc:  # a bug: say so in one line, keep the traceback for --debug users
        import traceback

        from aiptrain import settings

        if settings.debug():
            traceback.print_exc()
        environment = _environment_error(exc)
        if environment is not None:
            click.echo(f"ERROR: {_printable(str(environment))}", err=True)
            code = environment.exit_code
        else:
            click.echo(f"ERROR: aiptrain failed unexpectedly: {_printable(f'{type(exc).__name__}: {exc}')} "
                       "(set AIPTRAIN_DEBUG=1 for the traceback)", err=True)
            code = EXIT_INTERNAL
    sys.exit(code if isinstance(code, int) else 0)


def configure_logging(verbosity: str) -> None:
    """gcloud's --verbosity for aiptrain's own loggers: messages go to stderr as `INFO: ...`."""
    if verbosity == "warning" and "logging" not in sys.modules:
        return  # the default, and nothing configured before: keep start-up free of the import
    import logging

    logger = logging.getLogger("aiptrain")
    for handler in [h for h in logger.handlers if h.get_name() == "aiptrain-verbosity"]:
        logger.removeHandler(handler)  # main() may run more than once in a process (tests)
    logger.setLevel(logging.NOTSET)
    if verbosity == "warning":
        return  # the default: aiptrain says nothing below a warning, and logs none itself
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name("aiptrain-verbosity")
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.CRITICAL + 1 if verbosity == "none" else verbosity.upper())


def _environment_error(exc: Exception) -> AiptrainError | None:
    """A full disk, or the job store failing in the middle of a command (a page found damaged):
    one line naming the file and what to do, exit 3, rather than a bug report. Opening the
    store is checked where it is opened (aiptrain.jobtable)."""
    import errno


    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" writing [{exc.filename}]" if exc.filename else ""
        return EnvironmentNotReady(f"The disk is full{where} ({exc.strerror}): free space on it, then try again.")
    database_errors = tuple(getattr(sys.modules.get(name), error, ())
                            for name, error in (("sqlite3", "DatabaseError"), ("psycopg", "Error")))
    if not isinstance(exc, database_errors):
        return None
    from aiptrain.jobtable import store_problem
    from aiptrain.settings import Settings

    return store_problem(Settings().store, exc)


def _printable(message: str) -> str:
    """An error message as one line of plain text: a value echoed in it (a newline in a label, an
    escape sequence in a job ID) can neither break the line nor drive the terminal."""
    from aiptrain.logs import printable

    return printable(message.strip(), one_line=True)


def _show_click_error(exc: click.ClickException) -> None:
    """One line, as gcloud's `ERROR: ...`: the problem, then the command's usage and where its help
    is. A group run without a command shows its help instead (click's NoArgsIsHelpError)."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        click.echo(ctx.get_help(), err=True)
        return
    message = _printable(" ".join(exc.format_message().split()))
    if isinstance(exc, click.UsageError) and ctx is not None:
        usage = " ".join(ctx.get_usage().split())
        message = f"{message.rstrip('.')}. {usage} (`{ctx.command_path} {ctx.help_option_names[0]}` for help)."
    click.echo(f"ERROR: {message}", err=True)

"""The `aiptrain` command line: a thin click layer over aiptrain.submission, aiptrain.jobs
and aiptrain.runtimes.

Only click is imported at start-up; each command imports what it needs when it runs,
so `aiptrain --help` starts about as fast as click itself.
"""

from __future__ import annotations

import sys

import click

from aiptrain.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, AiptrainError


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
        "cache": ("aiptrain.cli.cache", "cache", "Prune the cache of packages and wheelhouses."),
        "jobs": ("aiptrain.cli.jobs", "jobs", "Submit and manage training jobs."),
        "runtimes": ("aiptrain.cli.runtimes", "runtimes", "List and build runtime images."),
    },
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="aiptrain")
def cli() -> None:
    """Google AI Platform Training's job model on your own machines.

    Scripts written for `gcloud ai-platform jobs ...` work with `aiptrain jobs ...`.

    \b
    Exit status: 0 success; 1 the job failed or was cancelled (when waiting on it);
    2 usage or validation error; 3 environment not ready (Docker, images, GPUs);
    4 aiptrain failed; 130 interrupted.
    """


def main(argv: list[str] | None = None) -> None:
    try:
        code = cli.main(args=argv, prog_name="aiptrain", standalone_mode=False)
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
        import os
        import traceback

        if os.environ.get("AIPTRAIN_DEBUG"):
            traceback.print_exc()
        click.echo(f"ERROR: aiptrain failed unexpectedly: {type(exc).__name__}: {exc} "
                   "(set AIPTRAIN_DEBUG=1 for the traceback)", err=True)
        code = EXIT_INTERNAL
    sys.exit(code if isinstance(code, int) else 0)


def _printable(message: str) -> str:
    from aiptrain.logs import printable

    return printable(message)


def _show_click_error(exc: click.ClickException) -> None:
    """The problem first, on one line (as gcloud's `ERROR: ...`), then the usage hint."""
    click.echo(f"ERROR: {_printable(exc.format_message())}", err=True)
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click.UsageError) and ctx is not None:
        click.echo(ctx.get_usage(), err=True)
        click.echo(f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help.", err=True)

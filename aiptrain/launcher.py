"""The `aiptrain` command's entry point: a `jobs` command goes to the home's command server when
one runs (aiptrain.commandserver: no imports to pay for), else runs in this process. Nothing is
imported here for other commands: `aiptrain --help` starts as fast as click allows."""

from __future__ import annotations

import sys


def serves(argv: list[str]) -> bool:
    """Whether a command line is one the command server runs: the `jobs` commands (in any of
    gcloud's spellings). Long-running servers (`serve`, `controller run`) and `local train` (the
    user's trainer, in this very process's terminal session) always run in their own process."""
    words = argv[: argv.index("--")] if "--" in argv else argv
    return "jobs" in words


def main() -> None:
    argv = sys.argv[1:]
    if serves(argv):
        from aiptrain import commandserver
        from aiptrain.settings import default_home

        status = commandserver.forward(argv, default_home())
        if status is not None:
            sys.exit(status)
    from aiptrain.cli import main as run_here

    run_here()

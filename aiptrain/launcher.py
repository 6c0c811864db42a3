"""The `aiptrain` command's entry point: a `jobs` command goes to the home's command server when
one runs (aiptrain.commandserver: no imports to pay for), else runs in this process."""

from __future__ import annotations

import sys


def main() -> None:
    from aiptrain import commandserver

    argv = sys.argv[1:]
    if commandserver.serves(argv):
        from aiptrain.runner.control import code_version
        from aiptrain.settings import default_home

        status = commandserver.forward(argv, default_home(), code_version())
        if status is not None:
            sys.exit(status)
    from aiptrain.cli import main as run_here

    run_here()

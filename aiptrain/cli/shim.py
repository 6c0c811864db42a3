"""`aiptrain gcloud-shim install [DIR]`: a `gcloud` executable that runs `gcloud ai-platform ...`
and `gcloud ml-engine ...` (beta/alpha and global flags included) with this aiptrain, and
refuses every other gcloud command, so a pipeline written for gcloud runs unedited.

`python -m aiptrain.cli.shim ARGS...` is what the installed script runs.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click

from aiptrain.errors import EXIT_USAGE

MARKER = "# aiptrain gcloud shim"


def default_bin_dir() -> Path:
    """The per-user bin directory of the XDG layout (pip --user and pipx use it too)."""
    return Path(os.environ.get("XDG_BIN_HOME") or Path.home() / ".local" / "bin")


def shim_script(python: str, package_root: str) -> str:
    """The shim: this interpreter with this aiptrain's package first on its path."""
    return (
        "#!/bin/sh\n"
        f"{MARKER}: runs `gcloud ai-platform|ml-engine ...` with aiptrain and refuses any other gcloud\n"
        "# command. Written by `aiptrain gcloud-shim install`; delete this file to undo.\n"
        f"PYTHONPATH={shlex.quote(package_root)}${{PYTHONPATH:+:$PYTHONPATH}} "
        f'exec {shlex.quote(python)} -m aiptrain.cli.shim "$@"\n'
    )


@click.group(name="gcloud-shim")
def gcloud_shim() -> None:
    """A `gcloud` on PATH that forwards ai-platform and ml-engine commands to aiptrain."""


@gcloud_shim.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace a `gcloud` in DIRECTORY that is not aiptrain's shim.")
def install(directory: Path | None, force: bool) -> None:
    """Write an executable `gcloud` into DIRECTORY (default: ~/.local/bin)."""
    import aiptrain

    directory = (directory or default_bin_dir()).expanduser().resolve()
    target = directory / "gcloud"
    if target.exists() and not force and MARKER not in target.read_text(errors="replace"):
        raise click.UsageError(f"[{target}] exists and is not aiptrain's shim: choose another DIRECTORY or pass --force.")
    package_root = str(Path(aiptrain.__file__).resolve().parent.parent)
    directory.mkdir(parents=True, exist_ok=True)
    target.write_text(shim_script(sys.executable, package_root))
    target.chmod(0o755)
    click.echo(f"Wrote [{target}]: `gcloud ai-platform|ml-engine ...` now runs aiptrain.", err=True)
    path_dirs = [Path(p).resolve() for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    if not path_dirs or path_dirs[0] != directory:
        click.echo(f'Put it first on your PATH to use it:\n  export PATH="{directory}:$PATH"', err=True)


def main(argv: list[str] | None = None) -> None:
    """The installed shim: aiptrain's CLI for the gcloud commands it emulates, one line and
    exit 2 for any other."""
    from aiptrain.cli import main as aiptrain_main
    from aiptrain.cli.gcloud import GcloudUsageError, is_gcloud_surface, split_global_flags

    argv = sys.argv[1:] if argv is None else argv
    try:
        rest, _ = split_global_flags(argv)
    except GcloudUsageError:
        aiptrain_main(argv)  # which reports the malformed flag itself
        return
    if not is_gcloud_surface(rest):
        command = " ".join(["gcloud", *rest[:2]])
        click.echo(
            "ERROR: (gcloud) this `gcloud` is aiptrain's shim: it runs only `gcloud ai-platform ...` and "
            f"`gcloud ml-engine ...`; run `{command}` with the real gcloud.",
            err=True,
        )
        sys.exit(EXIT_USAGE)
    aiptrain_main(argv)


if __name__ == "__main__":
    main()

"""`aiptrain gcloud-shim install [DIR]`: a `gcloud` executable that runs `gcloud ai-platform ...`
and `gcloud ml-engine ...` (beta/alpha and global flags included) with this aiptrain, and
refuses every other gcloud command, so a pipeline written for gcloud runs unedited.

Pipelines also read and set properties (`PROJECT=$(gcloud config get-value project)`,
`gcloud config set compute/region us-east1`) and log in (`gcloud auth
activate-service-account`): the shim keeps properties in `$AIPTRAIN_HOME/gcloud-properties.json`
(gcloud's `CLOUDSDK_SECTION_NAME` variables win, as in gcloud), where aiptrain's Settings
read them (aiptrain.gcloud_properties), and answers `gcloud auth ...` with a note that it has no local effect.

`python -m aiptrain.cli.shim ARGS...` is what the installed script runs.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click

import aiptrain
from aiptrain import gcloud_properties
from aiptrain.errors import EXIT_USAGE, EnvironmentNotReady

MARKER = "# aiptrain gcloud shim"


def default_bin_dir() -> Path:
    """The per-user bin directory of the XDG layout (pip --user and pipx use it too)."""
    return Path(os.environ.get("XDG_BIN_HOME") or Path.home() / ".local" / "bin")


def shim_script(python: str, package_root: str, module: str = "aiptrain.cli.shim") -> str:
    """A shim: this interpreter with this aiptrain's package first on its path, running `module`."""
    return (
        "#!/bin/sh\n"
        f"{MARKER}: runs `gcloud ai-platform|ml-engine ...` (or gsutil on gs:// kept locally) with\n"
        "# aiptrain. Written by `aiptrain gcloud-shim install`; delete this file to undo.\n"
        f"PYTHONPATH={shlex.quote(package_root)}${{PYTHONPATH:+:$PYTHONPATH}} "
        f'exec {shlex.quote(python)} -m {module} "$@"\n'
    )


@click.group(name="gcloud-shim")
def gcloud_shim() -> None:
    """A `gcloud` on PATH that forwards ai-platform and ml-engine commands to aiptrain."""


@gcloud_shim.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace a `gcloud` in DIRECTORY that is not aiptrain's shim.")
def install(directory: Path | None, force: bool) -> None:
    """Write an executable `gcloud` into DIRECTORY (default: ~/.local/bin)."""
    directory = (directory or default_bin_dir()).expanduser().resolve()
    target = directory / "gcloud"
    if target.exists() and not force and MARKER not in target.read_text(errors="replace"):
        raise click.UsageError(f"[{target}] exists and is not aiptrain's shim: choose another DIRECTORY or pass --force.")
    package_root = str(Path(aiptrain.__file__).resolve().parent.parent)
    scripts = {target: (shim_script(sys.executable, package_root),
                        "`gcloud ai-platform|ml-engine ...` now runs aiptrain.")}
    gsutil = directory / "gsutil"
    if not gsutil.exists() or MARKER in gsutil.read_text(errors="replace") or force:
        scripts[gsutil] = (shim_script(sys.executable, package_root, "aiptrain.cli.gsutil"),
                           "`gsutil` works on gs:// paths kept on this machine.")
    _write_scripts(directory, {path: text for path, (text, _) in scripts.items()})
    for path, (_, what) in scripts.items():
        click.echo(f"Wrote [{path}]: {what}", err=True)
    path_dirs = [Path(p).resolve() for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    if not path_dirs or path_dirs[0] != directory:
        click.echo(f'Put it first on your PATH to use it:\n  export PATH="{directory}:$PATH"', err=True)


def _write_scripts(directory: Path, scripts: dict[Path, str]) -> None:
    """Write the executables all or none: each beside its target first, then renamed over it.
    A directory that cannot be written is the environment's problem (exit 3), said in one line."""
    partials = {path: path.with_name(f".{path.name}.partial") for path in scripts}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for path, text in scripts.items():
            partials[path].write_text(text)
            partials[path].chmod(0o755)
        for path, partial in partials.items():
            partial.replace(path)
    except OSError as exc:
        for partial in partials.values():
            try:
                partial.unlink(missing_ok=True)
            except OSError:
                pass
        raise EnvironmentNotReady(
            f"Cannot write the shim into [{directory}]: {exc.strerror or exc}; choose a directory you can write "
            "(`aiptrain gcloud-shim install DIRECTORY`) or make this one writable."
        ) from None


# -- gcloud properties -------------------------------------------------------------------------


def _properties_path() -> Path:
    from aiptrain.settings import Settings

    return Settings().home / gcloud_properties.FILE_NAME


def _property_name(name: str) -> str:
    """`project` is `core/project`, as gcloud reads a property without a section."""
    return name if "/" in name else f"core/{name}"


def _stored() -> dict[str, str]:
    return gcloud_properties.stored(_properties_path().parent)


def load_properties() -> dict[str, str]:
    """The stored properties, each as its CLOUDSDK_ variable overrides it."""
    return {prop: os.environ.get(gcloud_properties.env_name(prop)) or value for prop, value in _stored().items()}


def _save_properties(properties: dict[str, str]) -> None:
    import json

    path = _properties_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(properties, indent=2, sort_keys=True))


def get_property(prop: str) -> str | None:
    return gcloud_properties.get(prop, _properties_path().parent)


def config_command(args: list[str], format_spec: str | None) -> int:
    """`gcloud config get-value|set|unset|list`, with gcloud's output and messages."""
    verb, names = (args[0], args[1:]) if args else ("", [])
    if verb == "get-value" and len(names) == 1:
        value = get_property(_property_name(names[0]))
        if value is None:
            click.echo("(unset)", err=True)
        else:
            click.echo(value)
        return 0
    if verb == "set" and len(names) == 2:
        prop = _property_name(names[0])
        _save_properties({**_stored(), prop: names[1]})
        click.echo(f"Updated property [{prop}].", err=True)
        return 0
    if verb == "unset" and len(names) == 1:
        prop = _property_name(names[0])
        _save_properties({k: v for k, v in _stored().items() if k != prop})
        click.echo(f"Unset property [{prop}].", err=True)
        return 0
    if verb == "list" and len(names) <= 1:
        wanted = _property_name(names[0]) if names else None
        properties = {k: v for k, v in sorted(load_properties().items()) if wanted in (None, k)}
        if wanted and wanted not in properties and (value := get_property(wanted)) is not None:
            properties[wanted] = value
        click.echo(_render_properties(properties, format_spec), nl=False)
        return 0
    click.echo("ERROR: (gcloud.config) aiptrain's shim supports `config get-value|set|unset|list PROPERTY`.", err=True)
    return EXIT_USAGE


def _render_properties(properties: dict[str, str], format_spec: str | None) -> str:
    """gcloud's INI-like listing, or `value(core.project)` as scripts ask for it."""
    if format_spec and format_spec.startswith("value(") and format_spec.endswith(")"):
        keys = [key.strip().replace(".", "/", 1) for key in format_spec[6:-1].split(",")]
        return "\t".join(properties.get(key, "") for key in keys) + "\n"
    sections: dict[str, list[str]] = {}
    for prop, value in properties.items():
        section, _, name = prop.partition("/")
        sections.setdefault(section, []).append(f"{name} = {value}")
    return "".join(f"[{section}]\n" + "".join(f"{line}\n" for line in lines) for section, lines in sections.items())


def main(argv: list[str] | None = None) -> None:
    """The installed shim: aiptrain's CLI for the gcloud commands it emulates, one line and
    exit 2 for any other."""
    from aiptrain.cli import main as aiptrain_main
    from aiptrain.cli.gcloud import GcloudUsageError, is_gcloud_surface, split_global_flags

    argv = sys.argv[1:] if argv is None else argv
    try:
        rest, flags = split_global_flags(argv)
    except GcloudUsageError:
        aiptrain_main(argv)  # which reports the malformed flag itself
        return
    if rest[:1] == ["config"]:
        sys.exit(config_command(rest[1:], flags.format))
    if rest[:1] == ["storage"]:  # notebooks stage their data with it before a job
        from aiptrain.cli.gsutil import gcloud_storage

        sys.exit(gcloud_storage(rest[1:]))
    if rest[:1] == ["auth"]:
        click.echo(f"aiptrain's gcloud shim: `gcloud {' '.join(rest[:2])}` has no local effect "
                   "(jobs run as the calling user, with no Google credentials).", err=True)
        sys.exit(0)
    if not is_gcloud_surface(rest):
        command = " ".join(["gcloud", *rest[:2]])
        click.echo(
            "ERROR: (gcloud) this `gcloud` is aiptrain's shim: it runs only `gcloud ai-platform ...`, "
            f"`gcloud ml-engine ...` and `gcloud storage ...`; run `{command}` with the real gcloud.",
            err=True,
        )
        sys.exit(EXIT_USAGE)
    aiptrain_main(argv)


if __name__ == "__main__":
    main()

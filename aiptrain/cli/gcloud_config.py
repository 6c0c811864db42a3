"""`aiptrain gcloud-config`: point Google's real gcloud (and its gsutil) at an `aiptrain serve`
through a named gcloud configuration of its own (aiptrain.gcloud_configuration)."""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from aiptrain.errors import EnvironmentNotReady, ValidationError

DEFAULT_URL = "http://127.0.0.1:8080"  # `aiptrain serve`'s default address
DEFAULT_CONFIGURATION = "aiptrain"


@click.command(name="gcloud-config")
@click.option("--url", help=f"The server's URL [default: AIPTRAIN_API (client mode's), else {DEFAULT_URL}].")
@click.option("--region", help="compute/region, for command lines without --region (gcloud needs one).")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
              help="A file holding the bearer token of a server with --tokens, read by gcloud where it is "
                   "[default: client mode's AIPTRAIN_API_TOKEN or AIPTRAIN_API_TOKEN_FILE, copied].")
@click.option("--activate/--no-activate", default=True, show_default=True,
              help="Make it gcloud's active configuration.")
@click.option("--force", is_flag=True, help="Replace a configuration of that name that aiptrain did not write.")
def gcloud_config(url: str | None, region: str | None, token_file: Path | None,
                  activate: bool, force: bool) -> None:
    """Write a gcloud configuration that sends `gcloud ai-platform`, `gcloud storage`,
    `gcloud logging` and `gsutil` to an `aiptrain serve`. gcloud's global flags
    `--configuration NAME` name it (default: aiptrain) and `--project P` its core/project
    (default: CLOUDSDK_CORE_PROJECT, else aiptrain's default project).

    \b
    aiptrain serve &                  # in another terminal, or a team server's URL with --url
    aiptrain gcloud-config            # then gcloud as ever:
    gcloud ai-platform jobs submit training census_1 --package-path trainer/ \\
        --module-name trainer.task --staging-bucket gs://my-bucket --region us-central1 --stream-logs
    gcloud config configurations activate default    # back to Google
    """
    from aiptrain import gcloud_configuration as configuration
    from aiptrain.cli.gcloud import GlobalFlags
    from aiptrain.settings import Settings

    flags = click.get_current_context().find_object(GlobalFlags) or GlobalFlags()
    name = flags.values.get("--configuration") or DEFAULT_CONFIGURATION
    problem = configuration.check_name(name)
    if problem:
        raise ValidationError(problem)
    settings = Settings()
    given = url or settings.api_url or DEFAULT_URL
    base = configuration.normalized_url(given)
    if base is None:
        raise ValidationError(f"--url [{given}] is not a server's URL: give http://HOST:PORT, as `aiptrain serve` "
                              "prints it.")
    directory = configuration.config_dir()
    path = configuration.configuration_path(directory, name)
    if path.exists() and not force and not configuration.written_by_us(path):
        raise ValidationError(f"gcloud configuration [{name}] exists and aiptrain did not write it: choose another "
                              "--configuration, or pass --force to replace it.")
    token, token_path = _token(token_file, settings.api_token, directory / "aiptrain-tokens" / name)
    target = configuration.Target(url=base, project=flags.project or settings.default_project, token_file=token_path,
                                  region=region)
    try:
        written = configuration.write(directory, name, target, token, activate)
    except OSError as exc:
        raise EnvironmentNotReady(f"Cannot write gcloud's configuration under [{directory}]: "
                                  f"{exc.strerror or exc}; set CLOUDSDK_CONFIG to a directory you can write.") from None
    for file in written:
        click.echo(f"Wrote [{file}]", err=True)
    state = "active" if activate else f"written; `gcloud config configurations activate {name}` uses it"
    click.echo(f"gcloud configuration [{name}] ({state}) sends gcloud ai-platform, ai, storage, logging and gsutil to "
               f"{base}, project [{target.project}].", err=True)
    if shutil.which("gcloud") is None:
        click.echo("WARNING: gcloud is not on your PATH: install the Google Cloud CLI to use this configuration, or "
                   "use `aiptrain gcloud-shim install` instead.", err=True)
    click.echo("Back to Google's endpoints: gcloud config configurations activate default", err=True)


def _token(token_file: Path | None, client_token: str, own_file: Path) -> tuple[str | None, Path]:
    """(the token to write into the configuration's own file, or None; the file gcloud reads it
    from). A --token-file is read where it is, and must hold a token; client mode's token
    (AIPTRAIN_API_TOKEN or AIPTRAIN_API_TOKEN_FILE) goes into a file of the configuration's own;
    without either, a placeholder that a server without tokens ignores."""
    from aiptrain.gcloud_configuration import OPEN_SERVER_TOKEN

    if token_file is None:
        return client_token or OPEN_SERVER_TOKEN, own_file
    try:
        with open(token_file, encoding="utf-8") as handle:
            first = handle.read(4096).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError(f"--token-file [{token_file}] cannot be read ({exc}): give the file that holds the "
                              "server's token.") from None
    if not first:
        raise ValidationError(f"--token-file [{token_file}] is empty: put the server's token on its first line.")
    return None, token_file.expanduser().resolve()

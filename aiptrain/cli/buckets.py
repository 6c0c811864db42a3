"""`aiptrain buckets`: which project each bucket of this home's gs:// tree belongs to
(aiptrain.storage.projects), and assigning the ones made before buckets had a project."""

from __future__ import annotations

import click

from aiptrain.errors import ValidationError


@click.group()
def buckets() -> None:
    """Buckets of this home's gs:// tree (AIPTRAIN_GCS=local) and their projects."""


def _gcs_root():
    from aiptrain.settings import Settings

    return Settings().gcs_root


@buckets.command(name="list")
def list_buckets() -> None:
    """Each bucket and its project (`-`: none, usable only without --tokens)."""
    from aiptrain.storage.projects import owners

    for bucket, project in owners(_gcs_root()).items():
        click.echo(f"gs://{bucket}\t{project or '-'}")


@buckets.command()
@click.argument("bucket_urls", nargs=-1, required=True)
def assign(bucket_urls: tuple[str, ...]) -> None:
    """Give buckets (gs://NAME or NAME) to the project gcloud's global flag `--project P` names:
    only that project's tokens and jobs may use them then."""
    from aiptrain.cli.gcloud import GlobalFlags
    from aiptrain.storage.projects import assign as assign_buckets

    flags = click.get_current_context().find_object(GlobalFlags) or GlobalFlags()
    project = flags.project
    if not project:
        raise ValidationError("Name the project the buckets go to: `aiptrain buckets assign BUCKET... --project P`.")
    names = [url.removeprefix("gs://").rstrip("/") for url in bucket_urls]
    assign_buckets(_gcs_root(), names, project)
    for name in names:
        click.echo(f"gs://{name} belongs to project [{project}].", err=True)

"""`aiptrain algorithms ...`: AI Platform's built-in algorithms, as images built here and
tagged with the service's names (gcr.io/cloud-ml-algos/...). A submit naming one builds it when
missing, as a missing runtime is built; `algorithms build` builds them ahead.

Only click is imported with this module: docker and the catalog load when a command runs.
"""

from __future__ import annotations

import click


@click.group()
def algorithms() -> None:
    """Built-in algorithms (linear learner, wide and deep, XGBoost, TabNet) and their images."""


@algorithms.command(name="list")
def list_() -> None:
    """List the built-in algorithms: name, the image names they answer to, whether built."""
    from aiptrain.algorithms.catalog import ALGORITHMS
    from aiptrain.cli.output import print_table
    from aiptrain.cli.runtimes import _built_images, _status

    built, problem = _built_images()
    if problem:
        click.echo(f"WARNING: cannot tell which images are built: {problem}", err=True)
    rows = [(a.name, a.title, a.framework, "\n".join(a.images), _status(a.image, built))
            for a in ALGORITHMS.values()]
    print_table(("ALGORITHM", "TITLE", "FRAMEWORK", "IMAGES", "STATUS"), rows, header_style="bold")


@algorithms.command()
@click.argument("names", nargs=-1, metavar="[ALGORITHM...]")
@click.option("--force", is_flag=True, help="Rebuild even if the image is current.")
def build(names, force) -> None:
    """Build the images of the named built-in algorithms (all when none is named), offline: each
    is its runtime image plus aiptrain's trainer, tagged with the service's image names."""
    from aiptrain.algorithms.catalog import lookup
    from aiptrain.algorithms.images import build_image, image_is_current
    from aiptrain.cli.runtimes import _build_display
    from aiptrain.settings import Settings

    settings = Settings()
    for algorithm in lookup(names):  # every name checked before anything is built
        if not force and image_is_current(algorithm):
            click.echo(f"Built-in {algorithm.title}: {algorithm.image} is already built (--force rebuilds it).")
            continue
        with _build_display(f"Building the built-in {algorithm.title} ({algorithm.image})") as progress:
            build_image(algorithm, settings.cache_dir, progress)
        click.echo(f"Built-in {algorithm.title}: built {', '.join(algorithm.images)}.")

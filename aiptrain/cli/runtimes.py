"""`aiptrain runtimes ...`: which runtime versions exist and building their images."""

from __future__ import annotations

import click


@click.group()
def runtimes() -> None:
    """Runtime versions and their local images."""


@runtimes.command(name="list")
def list_() -> None:
    """List runtime versions, their images and whether each is built."""
    from aiptrain.runtimes import RUNTIMES

    built = _built_images()
    for rt in RUNTIMES.values():
        state = "built" if rt.image in built else ("not built" if built is not None else "unknown")
        click.echo(f"{rt.version:<8} {rt.image:<26} {state:<10} {rt.description}")


def _built_images() -> set[str] | None:
    try:
        from aiptrain.backends.docker import connect
        from aiptrain.runtimes import IMAGE_REPOSITORY

        return {tag for image in connect().images(name=IMAGE_REPOSITORY) for tag in image.get("RepoTags") or []}
    except Exception:
        return None


@runtimes.command()
@click.argument("versions", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Rebuild even if the image exists.")
def build(versions, force) -> None:
    """Build the images of runtime VERSIONS (offline: wheels come from the host)."""
    from aiptrain.runtimes import build_image, runtime
    from aiptrain.settings import Settings

    settings = Settings()
    for version in versions:
        rt = runtime(version)
        image = build_image(rt, settings.base_image, settings.cache_dir, _progress(), force=force)
        click.echo(f"Runtime {version}: {image}")


def _progress():
    import sys

    if not sys.stderr.isatty():
        return lambda line: click.echo(line, err=True)
    from rich.console import Console

    console = Console(stderr=True)
    status = console.status("Building runtime image")
    status.start()

    def show(line: str) -> None:
        status.update(line[:100])
        if line.startswith(("Step ", "Downloading", "Building")):
            console.log(line[:160])

    return show

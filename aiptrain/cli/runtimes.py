"""`aiptrain runtimes ...`: which runtime versions exist, and building their images.

Only click is imported with this module: rich, docker and the runtime table load when
a command runs, so `aiptrain runtimes --help` stays fast.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

import click

# Progress lines that start a new phase of a build: the spinner names the latest one.
_STEP_PREFIXES = ("Step ", "Downloading ", "Building ")


@click.group()
def runtimes() -> None:
    """Runtime versions and their local images."""


@runtimes.command(name="list")
def list_() -> None:
    """List runtime versions: image, whether it is built, frameworks."""
    from aiptrain.cli.output import print_table
    from aiptrain.runtimes import RUNTIMES

    built, problem = _built_images()
    if problem:
        click.echo(f"WARNING: cannot tell which images are built: {problem}", err=True)
    rows = [(rt.version, rt.image, _status(rt.image, built), _frameworks(rt.packages)) for rt in RUNTIMES.values()]
    print_table(("VERSION", "IMAGE", "STATUS", "FRAMEWORKS"), rows, header_style="bold")


def _status(image: str, built: set[str] | None):
    from rich.text import Text

    if built is None:
        return Text("unknown", style="dim")
    return Text("built", style="green") if image in built else Text("not built", style="yellow")


def _frameworks(packages: tuple[str, ...]) -> str:
    return ", ".join(p.replace("==", " ") for p in packages) or "none (Python and pip only)"


def _built_images() -> tuple[set[str] | None, str | None]:
    """The runtime image tags on the engine, or (None, why not) when it cannot be asked."""
    from aiptrain.errors import AiptrainError

    try:
        from aiptrain.backends.docker import connect
        from aiptrain.runtimes import IMAGE_REPOSITORY

        images = connect(timeout=10).images(name=IMAGE_REPOSITORY)
    except AiptrainError as exc:
        return None, str(exc)
    except Exception as exc:  # the engine answered, but not as expected
        return None, f"{type(exc).__name__}: {exc}"
    return {tag for image in images for tag in image.get("RepoTags") or []}, None


@runtimes.command()
@click.argument("versions", nargs=-1, required=True, metavar="VERSION...")
@click.option("--force", is_flag=True, help="Rebuild even if the image exists.")
def build(versions, force) -> None:
    """Build the images of runtime VERSIONs (offline: the host downloads the wheels)."""
    from aiptrain.runtimes import build_image, image_exists, runtime
    from aiptrain.settings import Settings

    chosen = [runtime(v, given_as="runtime version") for v in versions]  # all checked before a long build
    settings = Settings()
    for rt in chosen:
        if not force and image_exists(rt.image):
            click.echo(f"Runtime {rt.version}: {rt.image} is already built (--force rebuilds it).")
            continue
        with _build_display(f"Building runtime {rt.version} ({rt.image})") as progress:
            image = build_image(rt, settings.base_image, settings.cache_dir, progress)
        click.echo(f"Runtime {rt.version}: built {image}.")


@contextmanager
def _build_display(title: str) -> Iterator[Callable[[str], None]]:
    """Where build progress goes: a spinner naming the current step on a terminal, every
    line as it comes otherwise (logs and CI)."""
    if not sys.stderr.isatty():
        click.echo(title, err=True)
        yield lambda line: click.echo(line, err=True)
        return
    from rich.console import Console

    with _spinner(Console(stderr=True, highlight=False), title) as show:
        yield show


@contextmanager
def _spinner(console, title: str) -> Iterator[Callable[[str], None]]:
    """A spinner showing the current step and the latest line; the steps stay printed above
    it. Leaving the block stops it however the build ended, so the cursor comes back."""
    from rich.text import Text

    def line_text(step: str, detail: str) -> Text:
        text = Text.assemble((step, "bold"), ("  " + detail if detail else "", "dim"))
        text.no_wrap, text.overflow = True, "ellipsis"  # one line, or the spinner scrolls the screen
        return text

    step = title
    with console.status(line_text(step, "")) as status:

        def show(line: str) -> None:
            nonlocal step
            if line.startswith(_STEP_PREFIXES):
                step = line
                console.print(Text(line, no_wrap=True, overflow="ellipsis"))
            status.update(line_text(step, "" if line == step else line))

        yield show

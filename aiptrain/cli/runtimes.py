"""`aiptrain runtimes ...`: which runtime versions exist, building their images, and
mapping a version to an image a team already has.

Only click is imported with this module: rich, docker and the runtime table load when
a command runs, so `aiptrain runtimes --help` stays fast.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

# Progress lines that start a new phase of a build: the spinner names the latest one.
_STEP_PREFIXES = ("Step ", "Downloading ", "Building ")


@click.group()
def runtimes() -> None:
    """Runtime versions and their local images."""


@runtimes.command(name="list")
def list_() -> None:
    """List runtime versions: image, whether it is built, base Python, frameworks."""
    from aiptrain.cli.output import print_table
    from aiptrain.runtimes import RUNTIMES, mapped
    from aiptrain.settings import Settings

    built, problem = _built_images()
    if problem:
        click.echo(f"WARNING: cannot tell which images are built: {problem}", err=True)
    teams = mapped(Settings().home)
    rows = [
        (rt.version, rt.image, _status(rt.image, built), f"{rt.python} ({rt.base.name})", _frameworks(rt.packages))
        for rt in RUNTIMES.values()
        if rt.version not in teams
    ]
    rows += [
        (version, entry["image"], _status(entry["image"], built), entry.get("python", "?"), "mapped (runtimes add)")
        for version, entry in teams.items()
    ]
    print_table(("VERSION", "IMAGE", "STATUS", "PYTHON", "FRAMEWORKS"), rows, header_style="bold")


def _status(image: str, built: set[str] | None):
    from rich.text import Text

    if built is None:
        return Text("unknown", style="dim")
    return Text("built", style="green") if image in built else Text("not built", style="yellow")


def _frameworks(packages: tuple[str, ...]) -> str:
    shown = [p.replace("==", " ") for p in packages if "==" in p]  # constraints (numpy<1.24) are not frameworks
    return ", ".join(shown) or "none (Python and pip only)"


def _built_images() -> tuple[set[str] | None, str | None]:
    """The image tags on the engine, or (None, why not) when it cannot be asked."""
    from aiptrain.errors import AiptrainError

    try:
        from aiptrain.backends.engine import connect

        images = connect(timeout=10).images()
    except AiptrainError as exc:
        return None, str(exc)
    except Exception as exc:  # the engine answered, but not as expected
        return None, f"{type(exc).__name__}: {exc}"
    return {tag for image in images for tag in image.get("RepoTags") or []}, None


@runtimes.command()
@click.argument("versions", nargs=-1, required=True, metavar="VERSION...")
@click.option("--force", is_flag=True, help="Rebuild even if the image is current.")
def build(versions, force) -> None:
    """Build the images of runtime VERSIONs (offline: the host downloads the wheels)."""
    from aiptrain.runtimes import build_image, image_is_current, lookup
    from aiptrain.settings import Settings

    settings = Settings()
    chosen = [lookup(v, settings.home, given_as="runtime version") for v in versions]  # all checked first
    for rt in chosen:
        if not force and image_is_current(rt):
            click.echo(f"Runtime {rt.version}: {rt.image} is already built (--force rebuilds it).")
            continue
        with _build_display(f"Building runtime {rt.version} ({rt.image})") as progress:
            image = build_image(rt, settings.cache_dir, progress)
        click.echo(f"Runtime {rt.version}: built {image}.")


@runtimes.command()
@click.argument("version")
@click.option("--image", required=True, help="An image on this Docker engine that has Python and pip.")
def add(version, image) -> None:
    """Map runtime VERSION to an IMAGE you already have; submit then runs it."""
    from aiptrain.runtimes import add_mapping
    from aiptrain.settings import Settings

    entry = add_mapping(version, image, Settings().home)
    click.echo(f"Runtime {version}: mapped to {image} (Python {entry['python']}).")


@runtimes.command()
@click.argument("version")
def remove(version) -> None:
    """Drop the image mapped to runtime VERSION (the image itself is kept)."""
    from aiptrain.runtimes import remove_mapping
    from aiptrain.settings import Settings

    remove_mapping(version, Settings().home)
    click.echo(f"Runtime {version}: mapping removed.")


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

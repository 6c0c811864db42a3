"""Output helpers shared by the commands."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click


def print_table(headers: tuple[str, ...], rows: list[tuple], header_style: str = "") -> None:
    """Columns as gcloud prints them: wide, unwrapped, no padding after the last column, so
    every row is one clean line for scripts."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, show_edge=False, pad_edge=False, header_style=header_style)
    for header in headers:
        table.add_column(header, no_wrap=True)
    for row in rows:
        # Text, so that no cell is read as rich markup; styled Text cells keep their style.
        table.add_row(*(cell if isinstance(cell, Text) else Text(str(cell)) for cell in row))
    console = Console(width=10_000, highlight=False, soft_wrap=True)
    with console.capture() as captured:
        console.print(table)
    click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


@contextmanager
def spinner() -> Iterator[Callable[[str], None]]:
    """A transient spinner on stderr naming the current step, on a terminal only: scripts and
    CI see gcloud's output unchanged (the steps are logged at --verbosity info as well)."""
    if not sys.stderr.isatty():
        yield lambda step: None
        return
    from rich.console import Console

    with Console(stderr=True, highlight=False).status("Submitting") as status:
        yield status.update

"""The README stays a front page and the reference stays complete: no Docker, no build.
(`make docs` builds docs/ strict, which checks every link and anchor inside it.)"""

from __future__ import annotations

import re

import click

from conftest import REPO

README = REPO / "README.md"
REFERENCE = REPO / "docs" / "reference"


def test_the_readme_is_short_and_keeps_its_runnable_sample():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200
    assert any(line.startswith(".venv/bin/aiptrain jobs submit training ") for line in lines)


def test_the_readme_links_to_files_that_exist():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local and [t for t in local if not (REPO / t).exists()] == []


def _commands(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from _commands(command, ctx, (*path, name))
        else:
            yield (*path, name), command


def test_the_flag_reference_names_every_option_of_every_command():
    from aiptrain.cli import cli

    text = (REFERENCE / "flags.md").read_text()
    missing = [
        (" ".join(path), opt)
        for path, command in _commands(cli, click.Context(cli))
        for param in command.params
        for opt in getattr(param, "opts", ())
        if opt.startswith("-") and not re.search(rf"`{re.escape(opt)}[`= ]", text)
    ]
    assert missing == []


def test_the_variable_reference_names_every_variable_aiptrain_reads():
    text = (REFERENCE / "environment.md").read_text()
    source = "\n".join(p.read_text() for p in (REPO / "aiptrain").rglob("*.py"))
    named = set(re.findall(r"\bAIPTRAIN_[A-Z_]+\b", source))
    assert {name for name in named if f"`{name}`" not in text} == set()

"""`aiptrain runtimes list|build`: output shape, errors, and the progress display."""

from __future__ import annotations

import io
import re

import pytest
from click.testing import CliRunner

from aiptrain.cli import runtimes as runtimes_cli
from aiptrain.runtimes import RUNTIMES


def table_rows(stdout: str) -> list[list[str]]:
    # Columns are separated by two or more spaces; "not built" has a single one.
    return [re.split(r"\s{2,}", line) for line in stdout.splitlines()]


def test_list_prints_one_row_per_runtime_with_status_and_frameworks(monkeypatch):
    monkeypatch.setattr(runtimes_cli, "_built_images", lambda: ({"aiptrain/runtime:minimal"}, None))
    result = CliRunner().invoke(runtimes_cli.runtimes, ["list"])
    assert result.exit_code == 0, result.output
    rows = table_rows(result.stdout)
    assert rows[0] == ["VERSION", "IMAGE", "STATUS", "FRAMEWORKS"]
    assert [row[:3] for row in rows[1:]] == [
        [rt.version, rt.image, "built" if rt.version == "minimal" else "not built"] for rt in RUNTIMES.values()
    ]
    assert rows[-1][3] == "none (Python and pip only)"
    assert rows[1][3] == "tensorflow-cpu 2.12.1, scikit-learn 1.2.2, pandas 1.5.3"
    assert all(line == line.rstrip() for line in result.stdout.splitlines())


def test_list_without_an_engine_says_unknown_and_why(monkeypatch):
    monkeypatch.setattr(runtimes_cli, "_built_images", lambda: (None, "Cannot reach the Docker engine"))
    result = CliRunner().invoke(runtimes_cli.runtimes, ["list"])
    assert result.exit_code == 0
    assert {row[2] for row in table_rows(result.stdout)[1:]} == {"unknown"}
    assert result.stderr == "WARNING: cannot tell which images are built: Cannot reach the Docker engine\n"


def test_unknown_version_is_one_line_and_exit_2_before_anything_is_built(cli):
    result = cli("runtimes", "build", "minimal", "9.9")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        "ERROR: Unknown runtime version [9.9]: choose one of 2.11, 2.8, 2.5, 2.1, minimal (`aiptrain runtimes list`).\n"
    )


@pytest.mark.docker
def test_list_shows_the_built_minimal_image(cli, minimal_runtime):
    rows = table_rows(cli("runtimes", "list", check_code=0).stdout)
    assert ["minimal", "aiptrain/runtime:minimal", "built", "none (Python and pip only)"] in rows


@pytest.mark.docker
def test_building_an_existing_image_is_a_no_op(cli, docker_api, minimal_runtime):
    before = docker_api.inspect_image("aiptrain/runtime:minimal")["Id"]
    result = cli("runtimes", "build", "minimal", check_code=0)
    assert result.stdout == "Runtime minimal: aiptrain/runtime:minimal is already built (--force rebuilds it).\n"
    assert result.stderr == ""
    assert docker_api.inspect_image("aiptrain/runtime:minimal")["Id"] == before


@pytest.mark.docker
def test_a_missing_base_image_is_exit_3_naming_it(cli, docker_api, monkeypatch):
    # --force gets past "already built"; the base image is checked before anything is built or replaced.
    monkeypatch.setenv("AIPTRAIN_BASE_IMAGE", "aiptrain/base:no-such-tag")
    result = cli("runtimes", "build", "--force", "minimal")
    assert result.returncode == 3
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and "Base image [aiptrain/base:no-such-tag] is missing" in errors[0]


def test_without_a_terminal_progress_is_plain_lines(capsys):
    with runtimes_cli._build_display("Building runtime x") as show:
        show("Step 1/2 : FROM base")
        show(" ---> 1234")
    assert capsys.readouterr().err == "Building runtime x\nStep 1/2 : FROM base\n ---> 1234\n"


def test_the_spinner_prints_steps_and_stops_even_when_the_build_fails():
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with pytest.raises(RuntimeError):
        with runtimes_cli._spinner(console, "Building runtime x") as show:
            show("Step 1/2 : FROM base")
            show("Collecting pandas")
            raise RuntimeError("build failed")
    written = out.getvalue()
    assert "Step 1/2 : FROM base\n" in written
    # Stopped: the cursor hidden at the start is shown again, and the spinner's line erased.
    assert written.rfind("\x1b[?25h") > written.rfind("\x1b[?25l") >= 0
    assert written.endswith("\x1b[2K")

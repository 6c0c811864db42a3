"""`aiptrain runtimes list|build`: output shape, errors, and the progress display."""

from __future__ import annotations

import io
import re

import pytest
from click.testing import CliRunner

from aiptrain.cli import runtimes as runtimes_cli
from aiptrain.runtimes import RUNTIMES

from conftest import SAMPLE_TRAINER, runtime_image


def table_rows(stdout: str) -> list[list[str]]:
    # Columns are separated by two or more spaces; "not built" has a single one.
    return [re.split(r"\s{2,}", line) for line in stdout.splitlines()]


def test_list_prints_one_row_per_runtime_with_status_and_frameworks(monkeypatch, home):
    monkeypatch.delenv("AIPTRAIN_IMAGE_REPOSITORY", raising=False)
    monkeypatch.setattr(runtimes_cli, "_built_images", lambda: ({"aiptrain/runtime:minimal"}, None))
    result = CliRunner().invoke(runtimes_cli.runtimes, ["list"])
    assert result.exit_code == 0, result.output
    rows = table_rows(result.stdout)
    assert rows[0] == ["VERSION", "IMAGE", "STATUS", "PYTHON", "FRAMEWORKS"]
    assert [row[:3] for row in rows[1:]] == [
        [rt.version, rt.image, "built" if rt.version == "minimal" else "not built"] for rt in RUNTIMES.values()
    ]
    by_version = {row[0]: row[3:] for row in rows[1:]}
    assert by_version["minimal"] == ["3.11 (bookworm)", "none (Python and pip only)"]
    assert by_version["pytorch-2.13"] == ["3.11 (bookworm)", "torch 2.13.0+cpu, cloudml-hypertune 0.1.0.dev6"]
    assert rows[1][3:] == [
        "3.9 (bullseye)",
        "tensorflow-cpu 2.11.0, scikit-learn 1.0.2, xgboost 1.6.2, pandas 1.3.5, cloudml-hypertune 0.1.0.dev6",
    ]
    assert all(line == line.rstrip() for line in result.stdout.splitlines())


def test_list_without_an_engine_says_unknown_and_why(monkeypatch, home):
    monkeypatch.setattr(runtimes_cli, "_built_images", lambda: (None, "Cannot reach the Docker engine"))
    result = CliRunner().invoke(runtimes_cli.runtimes, ["list"])
    assert result.exit_code == 0
    assert {row[2] for row in table_rows(result.stdout)[1:]} == {"unknown"}
    assert result.stderr == "WARNING: cannot tell which images are built: Cannot reach the Docker engine\n"


def test_unknown_version_is_one_line_and_exit_2_before_anything_is_built(cli):
    result = cli("runtimes", "build", "minimal", "9.9")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("ERROR: Unknown runtime version [9.9]: choose one of 2.11, 2.10, 2.9,")


def test_without_a_terminal_progress_is_plain_lines(capsys):
    with runtimes_cli._build_display("Building runtime x") as show:
        show("Step 1/2 : FROM base")
        show(" ---> 1234")
    assert capsys.readouterr().err == "Building runtime x\nStep 1/2 : FROM base\n ---> 1234\n"


def test_the_spinner_prints_steps_and_stops_even_when_the_build_fails():
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with pytest.raises(RuntimeError), runtimes_cli._spinner(console, "Building runtime x") as show:
        show("Step 1/2 : FROM base")
        show("Collecting pandas")
        raise RuntimeError("build failed")
    written = out.getvalue()
    assert "Step 1/2 : FROM base\n" in written
    # Stopped: the cursor hidden at the start is shown again, and the spinner's line erased.
    assert written.rfind("\x1b[?25h") > written.rfind("\x1b[?25l") >= 0
    assert written.endswith("\x1b[2K")


def test_dry_run_of_a_1x_runtime_plans_its_image_and_says_what_it_runs_and_gives_back(cli, tmp_path):
    result = cli(
        "jobs", "submit", "training", "old_tf", "--package-path", str(SAMPLE_TRAINER), "--module-name",
        "trainer.task", "--job-dir", str(tmp_path / "o"), "--runtime-version", "1.4", "--region", "us-central1",
        "--dry-run", check_code=0,
    )
    assert f"image: {runtime_image('1.4')}" in result.stdout
    assert result.stderr == (
        "NOTE: runtime 1.4 runs scikit-learn 0.24.2, XGBoost 0.90, pandas 1.1.5, the nearest releases for Python 3.9, "
        "and no TensorFlow (AI Platform ran TensorFlow 1.4.0, scikit-learn 0.19.1, XGBoost 0.72, pandas 0.22.0); a "
        "trainer that imports tensorflow fails: try --runtime-version 2.1; given back for its trainers: "
        "sklearn.externals.joblib and .six; scikit-learn's module paths before 0.24 (sklearn.ensemble.forest, "
        "sklearn.metrics.scorer, ...); as_matrix, get_value and set_value of DataFrame and Series.\n"
    )


def test_an_unknown_runtime_version_in_the_config_names_runtimeversion(cli, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("trainingInput:\n  runtimeVersion: '3.0'\n")
    result = cli(
        "jobs", "submit", "training", "x", "--package-path", str(SAMPLE_TRAINER), "--module-name", "trainer.task",
        "--config", str(config), "--dry-run",
    )
    assert result.returncode == 2
    assert result.stderr.startswith("ERROR: Unknown runtimeVersion in the config file [3.0]: choose one of 2.11,")


def test_removing_a_version_that_is_not_mapped_is_exit_2(cli):
    result = cli("runtimes", "remove", "1.15")
    assert result.returncode == 2
    assert result.stderr == "ERROR: Runtime version [1.15] is not mapped to an image (`aiptrain runtimes list`).\n"

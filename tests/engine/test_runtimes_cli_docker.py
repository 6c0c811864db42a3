"""aiptrain runtimes on the real engine: list, build, add; 1.x runtimes without their base image."""

from __future__ import annotations

from conftest import SAMPLE_TRAINER, runtime_image
from test_runtimes_cli import table_rows


def test_list_shows_the_built_minimal_image(cli, minimal_runtime):
    rows = table_rows(cli("runtimes", "list", check_code=0).stdout)
    assert ["minimal", runtime_image("minimal"), "built", "3.11 (bookworm)", "none (Python and pip only)"] in rows


def test_building_an_existing_image_is_a_no_op(cli, docker_api, minimal_runtime):
    image = runtime_image("minimal")
    before = docker_api.inspect_image(image)["Id"]
    result = cli("runtimes", "build", "minimal", check_code=0)
    assert result.stdout == f"Runtime minimal: {image} is already built (--force rebuilds it).\n"
    assert result.stderr == ""
    assert docker_api.inspect_image(image)["Id"] == before


def test_a_missing_base_image_is_exit_3_naming_it(cli, docker_api, monkeypatch):
    # --force gets past "already built"; the base image is checked before anything is built or replaced.
    monkeypatch.setenv("AIPTRAIN_BASE_IMAGE", "aiptrain/base:no-such-tag")
    result = cli("runtimes", "build", "--force", "minimal")
    assert result.returncode == 3
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and "Base image [aiptrain/base:no-such-tag] is missing" in errors[0]


def test_add_maps_a_version_to_an_image_that_submit_then_runs(cli, home, tmp_path, minimal_runtime):
    image = runtime_image("minimal")
    result = cli("runtimes", "add", "1.15", "--image", image, check_code=0)
    assert result.stdout == f"Runtime 1.15: mapped to {image} (Python 3.11).\n"
    rows = table_rows(cli("runtimes", "list", check_code=0).stdout)
    assert ["1.15", image, "built", "3.11", "mapped (runtimes add)"] in rows
    job_dir = tmp_path / "mapped-out"
    result = cli(
        "jobs", "submit", "training", "mapped_job", "--package-path", str(SAMPLE_TRAINER), "--module-name",
        "trainer.task", "--job-dir", str(job_dir), "--runtime-version", "1.15", "--stream-logs", "--", "--steps", "5",
    )
    assert result.returncode == 0, result.stderr
    assert "state: SUCCEEDED" in result.stdout
    assert cli("runtimes", "remove", "1.15", check_code=0).stdout == "Runtime 1.15: mapping removed.\n"
    assert ["1.15", image, "built"] not in [row[:3] for row in table_rows(cli("runtimes", "list").stdout)]


def test_add_refuses_an_image_the_engine_does_not_have(cli, home):
    result = cli("runtimes", "add", "1.15", "--image", "aiptrain-test/no-such-image:1")
    assert result.returncode == 3
    assert result.stderr == (
        "ERROR: Image [aiptrain-test/no-such-image:1] is not on this Docker engine: pull, load or build it first, "
        "then run this again.\n"
    )
    assert not (home / "runtimes.json").exists()

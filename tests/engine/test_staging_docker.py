"""A package whose name clashes with the trainer the submit builds is refused (exit 2); the refusal
comes after the engine is reached."""

from __future__ import annotations

import test_staging
from conftest import SAMPLE_TRAINER

files = test_staging.files  # fixtures of test_staging


def test_duplicate_of_the_built_trainer_is_rejected_exit_2(cli, files, tmp_path):
    clash = tmp_path / "dist" / "trainer-0.0.0.tar.gz"  # what --package-path builds, too
    clash.parent.mkdir()
    clash.write_bytes(b"x")
    result = cli(
        "jobs", "submit", "training", "dup", "--package-path", str(SAMPLE_TRAINER), "--module-name", "trainer.task",
        "--job-dir", str(tmp_path / "out"), "--packages", str(clash),
    )
    assert result.returncode == 2
    assert result.stderr == "ERROR: Cannot upload multiple packages with the same filename: [trainer-0.0.0.tar.gz]\n"
    assert cli("jobs", "list").stderr.strip() == "Listed 0 items."

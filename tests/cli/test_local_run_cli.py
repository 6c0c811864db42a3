"""`aiptrain local run` at the command line, with no engine: gcloud's flags, its refusals as one
line with exit 2, and a help that loads nothing heavy. Runs on the engine are in
tests/engine/test_local_run_docker.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from test_jobs_list import LISTS_WITHOUT_THE_MODEL

GCLOUD_FLAGS = ("--executor-image-uri", "--local-package-path", "--python-module", "--script", "--requirements",
                "--extra-packages", "--extra-dirs", "--output-image-uri", "--gpu", "--service-account-key-file")


def test_help_names_gcloud_s_flags_and_aiptrain_s(run):
    code, out, _ = run("local", "run", "--help")
    assert code == 0
    for flag in (*GCLOUD_FLAGS, "--worker-count", "--base-output-dir", "--display-name"):
        assert flag in out, flag


def test_local_run_help_imports_no_heavy_module(home):
    result = subprocess.run([sys.executable, "-c", LISTS_WITHOUT_THE_MODEL, "local", "run", "--help"],
                            capture_output=True, text=True)
    assert result.stdout and result.stderr.splitlines()[-1] == "imported: []", result.stderr


@pytest.fixture
def work_dir(tmp_path):
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "task.py").write_text("print('hi')\n")
    return tmp_path


@pytest.mark.parametrize("argv, message", [
    ([], "Missing option '--executor-image-uri'"),
    (["--executor-image-uri", "x", "--script", "trainer/task.py", "--python-module", "trainer.task"],
     "At most one of --python-module | --script may be specified"),
    (["--executor-image-uri", "x", "--requirements", "pandas"], "One of [--script, --python-module] must be supplied"),
    (["--executor-image-uri", "x", "--python-module", "trainer.nope"],
     "--python-module: File 'trainer/nope.py' is not found under the package"),
    (["--executor-image-uri", "x", "--script", "trainer/task.py", "--extra-dirs", "data,config"],
     "--extra-dirs: Directory 'data' is not found under the package"),
    (["--executor-image-uri", "Bad Image", "--script", "trainer/task.py"], "Invalid image name [Bad Image]"),
])
def test_refusals_are_one_line_and_exit_2(run, work_dir, monkeypatch, argv, message):
    monkeypatch.chdir(work_dir)
    code, out, err = run("local", "run", *argv)
    assert code == 2 and message in err, err
    assert len([line for line in err.splitlines() if line.startswith(("ERROR", "Error"))]) == 1, err


def test_a_missing_work_dir_is_refused(run, tmp_path):
    code, _, err = run("local", "run", "--executor-image-uri", "x", "--local-package-path", str(tmp_path / "nope"))
    assert code == 2 and "--local-package-path: Directory" in err and "is not found" in err

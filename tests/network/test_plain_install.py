"""Client mode from a plain `pip install aiptrain`, no extras (tests/cli/test_client_install.py
checks the imports against the dependencies): a fresh virtual environment gets this checkout's
dependencies from the package index (and the machine's pip configuration: its wheel cache or
mirror) and drives an `aiptrain serve` of the test's home. About half a minute with warm caches."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from test_client_mode_api import seed, server  # noqa: F401 - the fixture


@pytest.fixture
def plain_install(tmp_path_factory):
    """A virtual environment with this checkout pip-installed from a copy of it, without extras."""
    root = tmp_path_factory.mktemp("plain-install")
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "aiptrain", source / "aiptrain", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                                str(source)], capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return venv


@pytest.mark.network
def test_client_mode_runs_from_a_plain_install(plain_install, server, home):  # noqa: F811
    seed(server.home, "seeded_job")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(AIPTRAIN_API=server.url, AIPTRAIN_HOME=str(home), AIPTRAIN_COMMAND_SERVER="0")

    def aiptrain(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(plain_install / "bin" / "aiptrain"), *args], capture_output=True, text=True,
                              timeout=120, env=env, cwd=plain_install)

    where = subprocess.run(  # the aiptrain that runs is the installed one, with what remote.py imports
        [str(plain_install / "bin" / "python"), "-c", "import aiptrain.remote, googleapiclient.discovery, "
         "google_auth_httplib2; print(aiptrain.__file__)"], capture_output=True, text=True, env=env, cwd=plain_install)
    assert where.returncode == 0 and where.stdout.startswith(str(plain_install)), where.stderr
    listed = aiptrain("jobs", "list", "--format", "value(jobId,state)")
    assert (listed.returncode, listed.stdout) == (0, "seeded_job\tSUCCEEDED\n"), listed.stderr
    missing = aiptrain("jobs", "describe", "absent")  # googleapiclient's HttpError, as aiptrain's one line
    assert missing.returncode == 2 and "absent" in missing.stderr and "Traceback" not in missing.stderr

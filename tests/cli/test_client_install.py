"""Client mode from a plain `pip install aiptrain`, no extras: what aiptrain.remote imports is among
the package's own dependencies (google-api-python-client was only in the test extra once, and
`aiptrain jobs list` with AIPTRAIN_API crashed with `No module named 'google_auth_httplib2'`).

A fresh virtual environment gets this checkout from PyPI (and the machine's pip configuration:
its wheel cache or mirror) and drives an `aiptrain serve` of the test's home. Marked `network`:
`make test` runs it, `make unit` does not (about half a minute with warm caches, more without).
The check that remote.py imports only what the dependencies bring runs everywhere.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from test_client_mode_api import seed, server  # noqa: F401 - the fixture

# The distribution behind each top-level module aiptrain.remote imports from outside the
# standard library (the lower-case names pip writes).
DISTRIBUTIONS = {"google_auth_httplib2": "google-auth-httplib2", "httplib2": "httplib2",
                 "googleapiclient": "google-api-python-client", "google.auth": "google-auth",
                 "google.oauth2": "google-auth", "google.cloud": "google-cloud-storage",
                 "google.api_core": "google-api-core"}


def remote_imports() -> set[str]:
    """The modules aiptrain/remote.py imports that are neither aiptrain's nor the standard library's."""
    tree = ast.parse((REPO / "aiptrain" / "remote.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {name for name in names
            if name.split(".")[0] not in sys.stdlib_module_names and not name.startswith("aiptrain")}


def test_every_module_remote_imports_comes_with_the_dependencies():
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {Requirement(entry).name.lower() for entry in dependencies}
    imported = remote_imports()
    assert imported, "remote.py imports nothing from outside?"
    for module in imported:
        top = next((name for name in DISTRIBUTIONS if module == name or module.startswith(name + ".")), None)
        assert top is not None, f"aiptrain/remote.py imports {module}: name its distribution in DISTRIBUTIONS"
        distribution = DISTRIBUTIONS[top]
        # google-api-core comes with google-cloud-storage and google-api-python-client, both declared
        assert distribution in declared or distribution == "google-api-core", (module, distribution)


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

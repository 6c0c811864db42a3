"""Client mode from a plain `pip install aiptrain`, no extras: what aiptrain.remote imports is among
the package's own dependencies (google-api-python-client was only in the test extra once, and
`aiptrain jobs list` with AIPTRAIN_API crashed with `No module named 'google_auth_httplib2'`).
tests/network/test_plain_install.py installs the checkout into a fresh virtual environment from
the package index and drives a server with it.
"""

from __future__ import annotations

import ast
import sys

import pytest

from conftest import REPO

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

"""Which code a process runs, for the controller, the command server and the launcher to compare.

The launcher (the client half of the command server) imports this before anything else, so it
imports only what the interpreter has built in (see aiptrain/launcher.py); the runner imports it
without importing the launcher.
"""

from __future__ import annotations

import os

# The package's version (pyproject.toml says the same): here, so that this module needs nothing of
# the package above it; aiptrain/__init__.py offers it as aiptrain.__version__.
__version__ = "0.1.0"
_code_version: str | None = None


def code_version() -> str:
    """aiptrain's version and when its code last changed (an editable install changes without a
    new version number), taken once per process: the code a process runs is what it imported.
    A controller or command server of another code version must not serve this one."""
    global _code_version
    if _code_version is None:
        _code_version = f"{__version__}+{_newest_source(os.path.dirname(os.path.realpath(__file__)))}"
    return _code_version


def _newest_source(directory: str) -> int:
    """The newest modification time (ns) of the `.py` files under `directory`."""
    newest = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                newest = max(newest, _newest_source(entry.path))
            elif entry.name.endswith(".py"):
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime_ns)
    return newest

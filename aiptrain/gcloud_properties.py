"""gcloud's properties as aiptrain reads them, gcloud's way round: a `CLOUDSDK_SECTION_NAME`
variable wins, then what `gcloud config set` stored through aiptrain's shim in
`$AIPTRAIN_HOME/gcloud-properties.json`. Settings reads the ones aiptrain uses (core/project,
compute/region, api_endpoint_overrides/ml, ml_engine/local_python); the shim writes the file."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

FILE_NAME = "gcloud-properties.json"  # in the home


def env_name(prop: str) -> str:
    """`compute/region` -> CLOUDSDK_COMPUTE_REGION, gcloud's variable for the property."""
    return "CLOUDSDK_" + prop.replace("/", "_").upper()


def stored(home: Path) -> dict[str, str]:
    """The properties the shim stored for this home; {} when none (or the file is not JSON)."""
    path = home / FILE_NAME
    try:
        stat = path.stat()
    except OSError:
        return {}
    return dict(_read(str(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=4)
def _read(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, str], ...]:
    """Read once per version of the file: Settings asks for several properties at a time."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return ()
    if not isinstance(data, dict):
        return ()
    return tuple((str(k), str(v)) for k, v in data.items())


def get(prop: str, home: Path) -> str | None:
    return os.environ.get(env_name(prop)) or stored(home).get(prop) or None

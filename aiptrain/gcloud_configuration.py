"""A named configuration of Google's real gcloud that points it at an `aiptrain serve`
(`aiptrain gcloud-config`): `gcloud ai-platform`, `gcloud storage`, `gcloud logging` and
`gsutil` then talk to the server, with nothing of the user's own gcloud set-up changed.

gcloud keeps each configuration as an INI file, `CONFIG_DIR/configurations/config_NAME`, and
the active one's name in `CONFIG_DIR/active_config` (googlecloudsdk/core/configurations/
named_configs.py); this module writes those files as gcloud does, without running gcloud
ten times (a second each).

Why each property (see docs/guide/real-gcloud.md):
- `auth/access_token_file`: gcloud sends its token as `Authorization: Bearer`, and takes no
  credential of the account's, so no `gcloud auth login` is needed. A server without tokens
  ignores it; a file holding a placeholder keeps gcloud from asking for a login.
- `core/account`: the gsutil wrapper adds `CONFIG_DIR/legacy_credentials/ACCOUNT/.boto` to
  gsutil's boto path when it passes credentials; that file sets `use_gcloud_storage`, so gsutil
  runs its commands as `gcloud storage` with this configuration (gsutil's own JSON API client
  speaks only HTTPS to a host it is given).
- `api_endpoint_overrides/{ml,logging,storage,aiplatform}`: every API the commands call.
- `ml_engine/polling_interval`: `--stream-logs` polls Cloud Logging every 60 s by default; at
  1 s lines show within a second (gcloud still asks whether the job ended only every 10 s).
- `core/check_gce_metadata`: no probe of a metadata server that is not there.
"""

from __future__ import annotations

import configparser
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

MARKER = "# Written by `aiptrain gcloud-config`"
ACCOUNT = "aiptrain"  # the gsutil wrapper's boto file is found by the account's name
OPEN_SERVER_TOKEN = "no-token-needed"  # a server without --tokens reads no token; gcloud needs one to send
POLLING_INTERVAL_SECONDS = 1
_NAME = re.compile(r"[a-z][-a-z0-9]{0,63}")  # gcloud's rule for configuration names


@dataclass(frozen=True)
class Target:
    """What a configuration points gcloud at."""

    url: str  # the server's base URL, e.g. http://127.0.0.1:8080
    project: str
    token_file: Path  # holds the bearer token gcloud sends
    region: str | None = None


def config_dir() -> Path:
    """gcloud's configuration directory: CLOUDSDK_CONFIG, else ~/.config/gcloud (%APPDATA%\\gcloud on Windows)."""
    if os.environ.get("CLOUDSDK_CONFIG"):
        return Path(os.environ["CLOUDSDK_CONFIG"]).expanduser()
    if os.name == "nt" and os.environ.get("APPDATA"):
        return Path(os.environ["APPDATA"]) / "gcloud"
    return Path.home() / ".config" / "gcloud"


def check_name(name: str) -> str | None:
    """Why `name` cannot name a gcloud configuration; None when it can."""
    if name == "default" or not _NAME.fullmatch(name):
        return (f"--configuration [{name}] is not a name gcloud takes for this: use lower-case letters, digits "
                "and '-', starting with a letter, and not `default` (the configuration to go back to).")
    return None


def normalized_url(url: str) -> str | None:
    """The server's URL without a trailing slash; None when it is no http(s)://HOST[:PORT] URL."""
    match = re.fullmatch(r"(https?://[^/\s?#]+)/?", url.strip())
    return match.group(1) if match else None


def properties(target: Target) -> dict[str, dict[str, str]]:
    """The configuration's properties, by section."""
    url = target.url
    sections = {
        "core": {"project": target.project, "account": ACCOUNT, "check_gce_metadata": "False"},
        "auth": {"access_token_file": str(target.token_file)},
        "api_endpoint_overrides": {"ml": f"{url}/", "logging": f"{url}/", "storage": f"{url}/storage/v1/",
                                   "aiplatform": f"{url}/"},
        "ml_engine": {"polling_interval": str(POLLING_INTERVAL_SECONDS)},
    }
    if target.region:
        sections["compute"] = {"region": target.region}
    return sections


def render(sections: dict[str, dict[str, str]], comment: str) -> str:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_dict(sections)
    text = io.StringIO()
    parser.write(text)
    return f"{MARKER}: {comment}\n{text.getvalue()}"


BOTO = f"""{MARKER}: gsutil runs its commands as `gcloud storage`, with the
# configuration's endpoints and token (the gsutil wrapper reads this file for account {ACCOUNT}).
[GSUtil]
use_gcloud_storage = True
"""


def configuration_path(directory: Path, name: str) -> Path:
    return directory / "configurations" / f"config_{name}"


def written_by_us(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.readline().startswith(MARKER)
    except OSError:
        return False


def write(directory: Path, name: str, target: Target, token: str | None, activate: bool) -> list[Path]:
    """Write the configuration, the gsutil wrapper's boto file and `token` into the target's
    token file (None: the file is the user's own, left as it is); activate it when asked. The
    files a token is in are the user's alone (0600). Returns what was written."""
    written = []
    if token is not None:
        target.token_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _replace(target.token_file, token + "\n", 0o600)
        written.append(target.token_file)
    boto = directory / "legacy_credentials" / ACCOUNT / ".boto"
    boto.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not boto.exists() or written_by_us(boto):
        _replace(boto, BOTO, 0o600)
        written.append(boto)
    path = configuration_path(directory, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace(path, render(properties(target), f"gcloud talks to {target.url}"), 0o600)
    written.append(path)
    default = configuration_path(directory, "default")
    if not default.exists():  # what gcloud makes at its first run: `activate default` goes back to it
        _replace(default, "", 0o600)
        written.append(default)
    if activate:
        _replace(directory / "active_config", name, 0o644)
    return written


def _replace(path: Path, text: str, mode: int) -> None:
    """Write beside, then rename over: a reader never sees half a file."""
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(partial, mode)
    partial.replace(path)

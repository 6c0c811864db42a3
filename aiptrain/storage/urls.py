"""gs:// and local bucket URLs and Cloud Storage's naming rules: plain functions of strings, below
the bucket classes (local.py, gcs.py) and the package's factory (`open_bucket`), which all use them."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

from aiptrain.errors import ValidationError


def split_url(url: str) -> tuple[str, str]:
    """`gs://b/a/c` -> ('gs://b', 'a/c'); `file:///x/y` and `/x/y` -> local ('', '/x/y')."""
    if url.startswith("gs://"):
        name, _, path = url[len("gs://") :].partition("/")
        return f"gs://{name}", path.strip("/")
    return "", local_path(url)


def is_gcs(url: str) -> bool:
    return url.startswith("gs://")


def local_path(url: str) -> str:
    """A local directory given as `file:///dir` or a path; returned absolute."""
    if url.startswith("file://"):
        url = url[len("file://") :]
    return str(Path(url).expanduser().resolve())


_BUCKET_CHARACTERS = re.compile(r"^[a-z0-9][a-z0-9._-]*[a-z0-9]$")
_GOOGLE_LOOKALIKE = re.compile(r"g[o0][o0]g[l1]e")


def bucket_name(bucket_url: str) -> str:
    """The name of the bucket at `gs://NAME`, checked against Cloud Storage's rules."""
    name = bucket_url.removeprefix("gs://").strip("/")
    validate_bucket_name(name)
    return name


def object_name(prefix: str, path: str) -> str:
    """An object's full name inside its bucket: `prefix/path`, either may be empty."""
    return "/".join(p for p in (prefix, path.strip("/")) if p)


def validate_bucket_name(name: str) -> None:
    """Cloud Storage's bucket naming rules; one line saying which one `name` breaks."""
    problem = None
    if not 3 <= len(name) <= (222 if "." in name else 63):
        problem = "use 3-63 characters (up to 222 with dots)"
    elif not _BUCKET_CHARACTERS.match(name):
        problem = "use lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    elif any(len(part) > 63 for part in name.split(".")) or ".." in name:
        problem = "each dot-separated part must have 1-63 characters"
    elif _is_ip_address(name):
        problem = "a bucket name cannot be an IP address"
    elif name.startswith("goog") or _GOOGLE_LOOKALIKE.search(name):
        problem = "a bucket name cannot start with 'goog' or contain 'google' or a look-alike"
    if problem:
        raise ValidationError(f"[gs://{name}] is not a valid bucket name: {problem}.")


def _is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def check_gcs_uri(uri: str, kept_locally: bool) -> None:
    """A gs:// URL's bucket name, and, when it is kept on this machine, that its path cannot
    leave the bucket's directory ('.' and '..' segments are refused, not resolved)."""
    bucket_url, path = split_url(uri)
    bucket_name(bucket_url)
    if kept_locally and any(part in (".", "..") for part in path.split("/")):
        raise ValidationError(
            f"[{uri}] has a '.' or '..' segment, which could leave the bucket where gs:// paths are kept on "
            "this machine (AIPTRAIN_GCS=local): name the object without them."
        )


def emulator_host() -> str | None:
    """STORAGE_EMULATOR_HOST, which the Google client libraries read: a storage emulator, not Cloud Storage."""
    return os.environ.get("STORAGE_EMULATOR_HOST") or None

"""Buckets: where packages are staged and where job dirs may live.

A bucket is addressed by URL: `gs://name` (Google Cloud Storage), `file:///dir` or a
plain local directory path. The bucket classes are the only code that know how an
object path maps to storage; callers speak in object paths relative to the bucket.

gs:// is real Cloud Storage, or, with no way to reach it (AIPTRAIN_GCS=local, the default
when no credentials are found), a directory tree on this machine: `gs://BUCKET/PATH` is
`<gcs root>/BUCKET/PATH`, and the job's record keeps the gs:// URLs.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Protocol

from aiptrain.errors import ValidationError

GCS_MODES = ("auto", "local", "remote")
GCE_PRODUCT_NAME_FILE = Path("/sys/class/dmi/id/product_name")  # "Google Compute Engine" on a GCE VM


class Bucket(Protocol):
    url: str  # the bucket's own URL, e.g. gs://b or file:///srv/bucket

    def uri(self, path: str) -> str:
        """The URL of the object at `path` inside this bucket."""

    def exists(self, path: str) -> bool: ...

    def upload(self, source: Path, path: str) -> str:
        """Store a local file as the object at `path`; return the object's URL."""

    def copy(self, source: str, path: str, md5: str) -> str | None:
        """Make `path` a copy of the object at `source` without sending its bytes again
        (server-side copy, or a hard link), if `source` still holds content whose MD5
        (base64) is `md5`; return the new object's URL, or None to say "upload instead"."""

    def download(self, path: str, destination: Path) -> None: ...

    def delete_prefix(self, prefix: str) -> None:
        """Remove every object under `prefix`; nothing if there is none."""


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


def open_bucket(url: str, gcs_root: Path | None = None) -> Bucket:
    """The bucket at `url`. gs:// buckets are kept under `gcs_root` when one is given, else
    reached through google-cloud-storage (imported only then)."""
    if is_gcs(url):
        bucket_url, prefix = split_url(url)
        if gcs_root is not None:
            from aiptrain.storage.local import LocalGcsBucket

            return LocalGcsBucket(gcs_root, bucket_url, prefix)
        from aiptrain.storage.gcs import GcsBucket

        return GcsBucket(bucket_url, prefix)
    from aiptrain.storage.local import LocalBucket

    return LocalBucket(Path(local_path(url)))


# -- gs:// names --------------------------------------------------------------------------------

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


def local_gcs_path(gcs_root: Path, uri: str) -> Path:
    """Where `gs://BUCKET/PATH` is kept on this machine: `<gcs_root>/BUCKET/PATH`."""
    from aiptrain.storage.local import LocalGcsBucket

    bucket_url, path = split_url(uri)
    return LocalGcsBucket(gcs_root, bucket_url).object_file(path)


def kept_locally(gcs_root: Path, uris: list[str]) -> list[tuple[str, Path]]:
    """(gs:// URL, local path) for each URL that is kept on this machine (its path exists)."""
    found = []
    for uri in filter(is_gcs, uris):
        try:
            path = local_gcs_path(gcs_root, uri)
        except ValidationError:
            continue
        if path.exists():
            found.append((uri, path))
    return found


# -- real Cloud Storage, or kept on this machine -------------------------------------------------------


def emulator_host() -> str | None:
    """STORAGE_EMULATOR_HOST, which the Google client libraries read: a storage emulator, not Cloud Storage."""
    return os.environ.get("STORAGE_EMULATOR_HOST") or None


def gcs_root_for(mode: str, root: Path) -> tuple[Path | None, str | None]:
    """(`root` when gs:// paths are kept on this machine, else None; a one-line notice when that
    was decided for the user). `mode` is AIPTRAIN_GCS: `local`, `remote`, or `auto` (empty):
    remote with Google credentials or a storage emulator, local otherwise. Credentials are
    looked for as files, never by asking the metadata server, so the answer is instant offline."""
    mode = (mode or "auto").strip().lower()
    if mode not in GCS_MODES:
        raise ValidationError(f"AIPTRAIN_GCS=[{mode}] is not one of local, remote, auto: set one of them or unset it.")
    if mode == "remote" or (mode == "auto" and (emulator_host() or has_google_credentials())):
        return None, None
    if mode == "local":
        return root, None
    return root, (
        f"No Google Cloud credentials found: this job's gs:// paths are kept on this machine under {root} "
        "(set AIPTRAIN_GCS=remote to use Cloud Storage, AIPTRAIN_GCS=local to keep this without the warning)."
    )


def has_google_credentials() -> bool:
    """Whether Application Default Credentials would find something here: a credentials file
    (GOOGLE_APPLICATION_CREDENTIALS, gcloud's ADC file), a metadata server named by
    GCE_METADATA_HOST, or a Compute Engine VM (its DMI product name, google-auth's own offline
    check; NO_GCE_CHECK=true rules it out, as it does for google-auth)."""
    from aiptrain.storage.gcs import credentials_file

    if credentials_file() is not None or os.environ.get("GCE_METADATA_HOST"):
        return True
    if os.environ.get("NO_GCE_CHECK") == "true":
        return False
    try:
        return GCE_PRODUCT_NAME_FILE.read_text().strip().startswith("Google")
    except OSError:
        return False

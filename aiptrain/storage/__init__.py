"""Buckets: where packages are staged and where job dirs may live.

A bucket is addressed by URL: `gs://name` (Google Cloud Storage), `file:///dir` or a
plain local directory path. The bucket classes are the only code that know how an
object path maps to storage; callers speak in object paths relative to the bucket.

gs:// is real Cloud Storage, or, with no way to reach it (AIPTRAIN_GCS=local, the default
when no credentials are found), a directory tree on this machine: `gs://BUCKET/PATH` is
`<gcs root>/BUCKET/PATH`, and the job's record keeps the gs:// URLs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from aiptrain.errors import ValidationError
from aiptrain.storage.gcs import GcsBucket, credentials_file
from aiptrain.storage.local import LocalBucket, LocalGcsBucket
from aiptrain.storage.urls import bucket_name as bucket_name
from aiptrain.storage.urls import check_gcs_uri as check_gcs_uri
from aiptrain.storage.urls import emulator_host as emulator_host
from aiptrain.storage.urls import is_gcs as is_gcs
from aiptrain.storage.urls import local_path as local_path
from aiptrain.storage.urls import object_name as object_name
from aiptrain.storage.urls import split_url as split_url
from aiptrain.storage.urls import validate_bucket_name as validate_bucket_name

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


def open_bucket(url: str, gcs_root: Path | None = None) -> Bucket:
    """The bucket at `url`. gs:// buckets are kept under `gcs_root` when one is given, else
    reached through google-cloud-storage (imported only then)."""
    if is_gcs(url):
        bucket_url, prefix = split_url(url)
        if gcs_root is not None:
            return LocalGcsBucket(gcs_root, bucket_url, prefix)

        return GcsBucket(bucket_url, prefix)

    return LocalBucket(Path(local_path(url)))


# -- gs:// paths kept on this machine ----------------------------------------------------------

def local_gcs_path(gcs_root: Path, uri: str) -> Path:
    """Where `gs://BUCKET/PATH` is kept on this machine: `<gcs_root>/BUCKET/PATH`."""
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
    if credentials_file() is not None or os.environ.get("GCE_METADATA_HOST"):
        return True
    if os.environ.get("NO_GCE_CHECK") == "true":
        return False
    try:
        return GCE_PRODUCT_NAME_FILE.read_text().strip().startswith("Google")
    except OSError:
        return False

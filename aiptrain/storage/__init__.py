"""Buckets: where packages are staged and where job dirs may live.

A bucket is addressed by URL: `gs://name` (Google Cloud Storage), `file:///dir` or a
plain local directory path. The bucket classes are the only code that know how an
object path maps to storage; callers speak in object paths relative to the bucket.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


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


def open_bucket(url: str) -> Bucket:
    """The bucket at `url`. gs:// buckets import google-cloud-storage only when used."""
    if is_gcs(url):
        from aiptrain.storage.gcs import GcsBucket

        bucket_url, prefix = split_url(url)
        return GcsBucket(bucket_url, prefix)
    from aiptrain.storage.local import LocalBucket

    return LocalBucket(Path(local_path(url)))

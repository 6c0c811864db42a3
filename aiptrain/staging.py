"""Staging: put the job's packages in a bucket where gcloud would, and bring them back
to this host for the replicas.

Layout, as gcloud's uploads.py: with a staging bucket the objects go to
`<bucket>/<jobId>/<sha256>/<file>`, otherwise to `<jobDir>/packages/<sha256>/<file>`,
where <sha256> is one digest over the contents of all files uploaded together. The
dependencies' wheelhouse, when there is one, goes beside them in `<sha256>/wheelhouse/`.

Replicas get the packages by a read-only mount of a host directory, filled once per
job: N replicas never download N copies, and replicas need no bucket credentials
just to install the trainer.

Bytes are sent at most once per bucket: an object already at its path is left alone,
and a file this host staged before (remembered by sha256 in a small index in the
cache directory) is copied inside the bucket (a server-side copy on Cloud Storage, a
hard link in a local bucket) instead of being uploaded again under a new job's path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiptrain.jobpaths import WHEELHOUSE
from aiptrain.safe_files import partial_name
from aiptrain.storage import Bucket, is_gcs, open_bucket, split_url
from aiptrain.storage.local import feed_file, link_or_copy, md5_base64

log = logging.getLogger(__name__)


@dataclass
class StagedPackages:
    uris: list[str]  # packageUris, in install order
    bucket: Bucket | None = None
    created: list[str] = field(default_factory=list)  # object paths this submission created
    uploaded: list[str] = field(default_factory=list)  # ... of which these by sending their bytes
    wheelhouse_uris: list[str] = field(default_factory=list)

    def discard(self) -> None:
        """Remove what this submission created, and only that (objects already there may
        belong to another job)."""
        if self.bucket is not None:
            for path in reversed(self.created):
                self.bucket.delete_prefix(path)


def sha256_of(path: Path) -> str:
    return combined_sha256([path])


def combined_sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        feed_file(digest, path)
    return digest.hexdigest()


def staging_target(
    job_id: str, staging_bucket: str | None, job_dir: str | None, default_bucket: str, key: str | None = None
) -> tuple[str, str]:
    """(bucket URL, object prefix) where this job's packages go: in the default bucket, which
    every project of the installation shares, under the job's key (aiptrain.jobkeys; default: its ID)."""
    if staging_bucket:
        bucket_url, prefix = split_url(staging_bucket) if is_gcs(staging_bucket) else (staging_bucket, "")
        return bucket_url, "/".join(p for p in (prefix, job_id) if p)
    if job_dir:
        bucket_url, prefix = split_url(job_dir) if is_gcs(job_dir) else (job_dir, "")
        return bucket_url, "/".join(p for p in (prefix, "packages") if p)
    return default_bucket, key or job_id


# -- what this host has staged before ---------------------------------------------------------


class StagedIndex:
    """sha256 of a file -> URLs of objects this host staged with that content. Only a hint:
    a bucket re-checks the object's content before copying it, and a lost update only
    costs one upload."""

    KEEP_PER_FILE = 4
    KEEP_FILES = 500

    def __init__(self, path: Path):
        self.path = path
        try:
            self.entries: dict[str, list[str]] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.entries = {}

    def candidates(self, sha256: str, bucket: Bucket) -> list[str]:
        """Object paths inside `bucket` that held this content when they were staged."""
        base = bucket.uri("").rstrip("/") + "/"
        return [uri[len(base) :] for uri in reversed(self.entries.get(sha256, [])) if uri.startswith(base)]

    def remember(self, sha256: str, uri: str) -> None:
        uris = [u for u in self.entries.pop(sha256, []) if u != uri] + [uri]
        self.entries[sha256] = uris[-self.KEEP_PER_FILE :]
        while len(self.entries) > self.KEEP_FILES:
            self.entries.pop(next(iter(self.entries)))

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(partial_name(self.path.name))
        partial.write_text(json.dumps(self.entries, indent=0))
        os.replace(partial, self.path)


# -- staging ------------------------------------------------------------------------------------


def stage(
    files: list[Path],
    bucket_url: str,
    prefix: str,
    index: StagedIndex | None = None,
    wheelhouse: Sequence[Path] = (),
    gcs_root: Path | None = None,
) -> StagedPackages:
    """Put `files` under `<prefix>/<sha256>/` (and `wheelhouse` under `.../wheelhouse/`),
    sending the bytes of each only if the bucket cannot have them otherwise. With `gcs_root`,
    gs:// buckets are kept on this machine there."""
    if not files:
        return StagedPackages(uris=[])
    bucket = open_bucket(bucket_url, gcs_root)
    digest_prefix = f"{prefix}/{combined_sha256(files)}"
    staged = StagedPackages(uris=[], bucket=bucket)
    try:
        for path in files:
            staged.uris.append(_put(bucket, path, f"{digest_prefix}/{path.name}", index, staged))
        for path in wheelhouse:
            object_path = f"{digest_prefix}/{WHEELHOUSE}/{path.name}"
            staged.wheelhouse_uris.append(_put(bucket, path, object_path, index, staged))
    except BaseException:
        staged.discard()
        raise
    finally:
        if index is not None:
            index.save()
    log.debug("Staged %d object(s): %d uploaded, %d copied inside the bucket, %d already there.",
              len(files) + len(wheelhouse), len(staged.uploaded), len(staged.created) - len(staged.uploaded),
              len(files) + len(wheelhouse) - len(staged.created))
    return staged


def _put(bucket: Bucket, path: Path, object_path: str, index: StagedIndex | None, staged: StagedPackages) -> str:
    """The URL of `object_path` once it holds `path`'s content: already there, copied from an
    object with the same content, or uploaded (in that order of preference)."""
    if bucket.exists(object_path):
        log.debug("Already staged, not uploaded: %s", bucket.uri(object_path))
        return bucket.uri(object_path)
    sha256 = sha256_of(path)
    if index is not None:
        md5 = md5_base64(path)
        for source in index.candidates(sha256, bucket):
            uri = bucket.copy(source, object_path, md5)
            if uri:
                log.debug("Copied inside the bucket, not uploaded: %s (from %s)", uri, bucket.uri(source))
                staged.created.append(object_path)
                index.remember(sha256, uri)
                return uri
    uri = bucket.upload(path, object_path)
    log.debug("Uploaded %s (%d bytes)", uri, path.stat().st_size)
    staged.created.append(object_path)
    staged.uploaded.append(object_path)
    if index is not None:
        index.remember(sha256, uri)
    return uri


# -- bringing packages to the replicas ----------------------------------------------------------


def fetch(uris: list[str], destination: Path, gcs_root: Path | None = None) -> list[str]:
    """Copy the packages at `uris` into `destination`; return their file names in order.
    With `gcs_root`, gs:// packages are taken from there, where this machine keeps gs:// paths."""
    destination.mkdir(parents=True, exist_ok=True)
    names = []
    for uri in uris:
        bucket_url, path = split_url(uri)
        if is_gcs(uri):
            bucket = open_bucket(bucket_url, gcs_root)
        else:
            bucket, path = open_bucket(str(Path(path).parent)), Path(path).name
        name = path.rsplit("/", 1)[-1]
        target = destination / name
        if not target.exists():
            bucket.download(path, target)
        names.append(name)
    return names


def link_files(paths: list[Path], destination: Path) -> None:
    """Put `paths` in `destination` by hard link (a copy across file systems)."""
    destination.mkdir(parents=True, exist_ok=True)
    for path in paths:
        if not (destination / path.name).exists():
            link_or_copy(path, destination / path.name)

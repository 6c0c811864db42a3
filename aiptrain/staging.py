"""Staging: put the job's packages in a bucket where gcloud would, and bring them back
to this host for the replicas.

Layout, as gcloud's uploads.py: with a staging bucket the objects go to
`<bucket>/<jobId>/<sha256>/<file>`, otherwise to `<jobDir>/packages/<sha256>/<file>`,
where <sha256> is one digest over the contents of all files uploaded together.

Replicas get the packages by a read-only mount of a host directory, filled once per
job: N replicas never download N copies, and replicas need no bucket credentials
just to install the trainer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from aiptrain.storage import Bucket, is_gcs, open_bucket, split_url


@dataclass
class StagedPackages:
    uris: list[str]  # packageUris, in install order
    bucket: Bucket | None = None
    created_prefix: str | None = None  # what to delete if the submission is abandoned
    uploaded: list[str] = field(default_factory=list)

    def discard(self) -> None:
        if self.bucket is not None and self.created_prefix:
            self.bucket.delete_prefix(self.created_prefix)


def combined_sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def staging_target(job_id: str, staging_bucket: str | None, job_dir: str | None, default_bucket: str) -> tuple[str, str]:
    """(bucket URL, object prefix) where this job's packages go."""
    if staging_bucket:
        bucket_url, prefix = split_url(staging_bucket) if is_gcs(staging_bucket) else (staging_bucket, "")
        return bucket_url, "/".join(p for p in (prefix, job_id) if p)
    if job_dir:
        bucket_url, prefix = split_url(job_dir) if is_gcs(job_dir) else (job_dir, "")
        return bucket_url, "/".join(p for p in (prefix, "packages") if p)
    return default_bucket, job_id


def stage(files: list[Path], bucket_url: str, prefix: str) -> StagedPackages:
    """Upload `files` under `<prefix>/<sha256>/`; objects already there are not uploaded again."""
    if not files:
        return StagedPackages(uris=[])
    bucket = open_bucket(bucket_url)
    digest_prefix = f"{prefix}/{combined_sha256(files)}"
    staged = StagedPackages(uris=[], bucket=bucket)
    for path in files:
        object_path = f"{digest_prefix}/{path.name}"
        if bucket.exists(object_path):
            staged.uris.append(bucket.uri(object_path))
            continue
        staged.uris.append(bucket.upload(path, object_path))
        staged.uploaded.append(object_path)
        staged.created_prefix = digest_prefix
    return staged


def fetch(uris: list[str], destination: Path) -> list[str]:
    """Copy the packages at `uris` into `destination`; return their file names in order."""
    destination.mkdir(parents=True, exist_ok=True)
    names = []
    for uri in uris:
        bucket_url, path = split_url(uri)
        if is_gcs(uri):
            bucket = open_bucket(bucket_url)
        else:
            bucket, path = open_bucket(str(Path(path).parent)), Path(path).name
        name = path.rsplit("/", 1)[-1]
        target = destination / name
        if not target.exists():
            bucket.download(path, target)
        names.append(name)
    return names

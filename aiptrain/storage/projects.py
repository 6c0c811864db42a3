"""Projects own buckets, as on Cloud Storage: the host side of it (the storage endpoint enforces
it, aiptrain.storage.endpoint_server's Scope, on both doors: `aiptrain serve` and the endpoint
replicas reach).

- Each bucket of the gcs tree records its project (made by `gsutil mb -p`, `gcloud storage
  buckets create`, a create through the API, or the first write of a job or a submit).
- Each project's replicas carry one credential of that project only: a token derived from a
  secret of the home (so it is the same for every job of the project and never stored), which
  the endpoint knows by its SHA-256 (the scope record), handed to the clients in a replica as an
  authorized user's credentials file (google-auth: google-cloud-storage, gcsfs) and as
  GOOGLE_AUTH_TOKEN_FOR_TESTING (TensorFlow's GCS file system).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from aiptrain.errors import ValidationError
from aiptrain.storage import bucket_name, is_gcs, split_url
from aiptrain.storage.endpoint import ProjectCredential
from aiptrain.storage.endpoint_server import SCOPES, ApiError, Tree
from aiptrain.storage.local import REPLICA_IDS

SECRET_FILE = "project-credentials.key"  # in the endpoint's TLS dir: what each project's token derives from
CREDENTIALS_DIR = "credentials"  # in the TLS dir: one credentials file per project, mounted into its replicas
TOKEN_URI = "https://oauth2.googleapis.com/token"  # where google-auth refreshes (the endpoint answers)


def tree(gcs_root: Path, make: bool = True) -> Tree:
    """The gcs tree, what it makes handed to the replicas' user as every writer of it does
    (`make`: False for a look that leaves nothing behind)."""
    return Tree(str(gcs_root), REPLICA_IDS if os.geteuid() == 0 else None, make)


def project_credential(tls_dir: Path, gcs_root: Path, project: str,
                       shared: tuple[tuple[str, bool], ...] = ()) -> ProjectCredential:
    """The credential `project`'s replicas carry, its scope recorded for the endpoint and its
    credentials file written (both only when they change)."""
    token = "aiptrain-" + hmac.new(_secret(tls_dir), project.encode(), hashlib.sha256).hexdigest()
    record = json.dumps({"project": project, "buckets": dict(shared)}, sort_keys=True)
    digest = hashlib.sha256(token.encode()).hexdigest()
    files = tree(gcs_root)
    if files.read_record(SCOPES, digest) != record:
        files.write_record(SCOPES, digest, record)
    path = tls_dir / CREDENTIALS_DIR / f"{hashlib.sha256(project.encode()).hexdigest()[:24]}.json"
    content = json.dumps({"type": "authorized_user", "client_id": "aiptrain-replica", "client_secret": "aiptrain",
                          "refresh_token": token, "token_uri": TOKEN_URI}, indent=1)
    if not path.is_file() or path.read_text() != content:
        _write_private(path, content)
    return ProjectCredential(project=project, token=token, file=str(path))


def _secret(tls_dir: Path) -> bytes:
    path = tls_dir / SECRET_FILE
    if not path.is_file():
        tls_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(32))
        except FileExistsError:
            pass  # another process made it first: read theirs
    return path.read_bytes().strip()


def _write_private(path: Path, content: str) -> None:
    """A credentials file only the replicas' user reads (nobody's, when aiptrain runs as root)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
    with os.fdopen(fd, "w") as handle:
        handle.write(content)
    if os.geteuid() == 0:
        os.chown(partial, *REPLICA_IDS)
    os.replace(partial, path)


def check_buckets(gcs_root: Path, project: str, uris: list[str], shared: dict[str, bool] | None = None) -> None:
    """A job of `project` may name only buckets its replicas may use: its project's, those
    shared with it, or of no project where no team server serves the tree. ValidationError
    naming the first other one."""
    files = tree(gcs_root, make=False)
    for uri in uris:
        if not is_gcs(uri):
            continue
        bucket = bucket_name(split_url(uri)[0])
        if not files.bucket_exists(bucket) or bucket in (shared or {}):
            continue  # one that does not exist is made by the job's first write, for its project
        owner = files.owner_of(bucket)
        if owner == project or (owner is None and not files.team):
            continue
        whose = f"project [{owner}]" if owner else "no project (made before buckets had one)"
        raise ValidationError(f"[{uri}] is in bucket [{bucket}] of {whose}; a job of project [{project}] may use "
                              f"only its own project's buckets: pick one of [{project}]'s, or share the bucket "
                              "(docs/reference/security.md#what-separates-projects).")


def usable_buckets(gcs_root: Path, project: str, shared: dict[str, bool] | None = None) -> dict[str, bool]:
    """The buckets a job of `project` may use, by name -> writable: its project's, those shared
    with it, and those of no project where no team server serves the tree (check_buckets' rule)."""
    files = tree(gcs_root, make=False)
    usable = {bucket: True for bucket in files.buckets()
              if files.owner_of(bucket) == project or (files.owner_of(bucket) is None and not files.team)}
    return {**usable, **{bucket: writable for bucket, writable in (shared or {}).items() if files.bucket_exists(bucket)}}


def make_buckets(gcs_root: Path, uris: list[str], project: str) -> None:
    """The buckets `uris` name that do not exist yet, made for `project` (what a submit stages
    to or writes its job dir in: a bucket is made by its first write here)."""
    files = tree(gcs_root)
    for bucket in dict.fromkeys(bucket_name(split_url(uri)[0]) for uri in uris if is_gcs(uri)):
        if not files.bucket_exists(bucket):
            with contextlib.suppress(ApiError):  # made meanwhile by another writer: check_buckets judges it
                files.create_bucket(bucket, project)


def assign(gcs_root: Path, buckets: list[str], project: str) -> None:
    files = tree(gcs_root)
    for bucket in buckets:
        if not files.bucket_exists(bucket):
            raise ValidationError(f"[gs://{bucket}] does not exist here: `aiptrain buckets list` shows the buckets.")
    for bucket in buckets:
        files.set_owner(bucket, project)


def owners(gcs_root: Path) -> dict[str, str | None]:
    """Every bucket of the tree and its project (None: no project)."""
    files = tree(gcs_root)
    return {bucket: files.owner_of(bucket) for bucket in files.buckets()}


def serve_teams(gcs_root: Path) -> list[str]:
    """Mark the tree as served to teams (`serve --tokens`): a bucket of no project is then
    nobody's, through the API and in replicas alike. Returns the buckets of no project."""
    files = tree(gcs_root)
    files.mark_team()
    return [bucket for bucket, owner in owners(gcs_root).items() if owner is None]

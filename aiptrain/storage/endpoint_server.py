"""A Cloud Storage endpoint over a directory tree: `gs://BUCKET/NAME` is the plain file
`ROOT/BUCKET/NAME`, so what replicas write is visible on the host and what the host stages is
readable in replicas. It speaks the parts of the JSON API (and the XML API's media GET) that
TensorFlow's GCS filesystem, google-cloud-storage, gcsfs and aiptrain's in-replica gsutil use.

It runs inside an unprivileged container that sees nothing of the host but the gcs tree
(aiptrain.storage.endpoint starts it), so a link a trainer managed to plant could lead
nowhere outside; it still opens every path component without following links and serves
regular files only. Standard library only: it runs on any image with Python 3.9 or later.

Mapping rules (docs/design/storage.md): directories are implied by the objects below them; an
empty directory is listed as the directory-marker object `NAME/` (what TensorFlow creates for
a directory); an object and a "directory" of the same name cannot both exist (409).
"""

from __future__ import annotations

import socket
import ssl
import sys


def listen_early(argv: list[str]) -> socket.socket | None:
    """Run as the endpoint: its socket listening, with its certificate, before the rest is
    imported (most of its start-up), then the line that says it serves. The launch waits for
    that line; a request that comes before the server accepts waits in the backlog instead of
    being refused."""
    options = {name: argv[i + 1] for i, name in enumerate(argv[:-1]) if name.startswith("--")}
    if "--port" not in options:
        return None
    listening = secured(socket.create_server(("0.0.0.0", int(options["--port"])), backlog=128),
                        options.get("--cert"), options.get("--key"))
    say_serving(options.get("--root", ""), int(options["--port"]))
    return listening


def secured(listening: socket.socket, cert: str | None, key: str | None) -> socket.socket:
    """TLS on what `listening` accepts. The handshake is each connection's own (`shake_hands`,
    in its thread), not the accept loop's: there a client that connects and says nothing would
    hold up every other one."""
    if not cert:
        return listening
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context.wrap_socket(listening, server_side=True, do_handshake_on_connect=False)


HANDSHAKE_SECONDS = 10


def shake_hands(connection: socket.socket) -> bool:
    """The TLS handshake of an accepted connection (none without TLS), within HANDSHAKE_SECONDS;
    False when it fails: a client gone, one that said nothing, one that is no TLS client."""
    if not isinstance(connection, ssl.SSLSocket):
        return True
    try:
        connection.settimeout(HANDSHAKE_SECONDS)
        connection.do_handshake()
        connection.settimeout(None)
        return True
    except OSError:  # ssl.SSLError and timeouts among them
        return False


def say_serving(root: str, port: int) -> None:
    print(f"aiptrain storage endpoint: serving {root} on port {port}", file=sys.stderr, flush=True)


EARLY_SOCKET = listen_early(sys.argv) if __name__ == "__main__" else None

# ruff: noqa: E402 - imported once the socket listens, above
import argparse
import base64
import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

try:  # C code where the image has it (every runtime image with google-cloud-storage), else a table
    import google_crc32c
except ImportError:
    google_crc32c = None  # type: ignore[assignment]  # the table then

BLOCK = 1 << 20
MAX_METADATA_BYTES = 1 << 20  # JSON bodies (metadata, rewrite requests): never more than this in memory
PAGE_SIZE = 1000
UPLOADS_DIR = ".aiptrain-uploads"  # partial uploads, at the tree's top (never a valid bucket name)
# Who owns what, at the tree's top too (never a valid bucket name): OWNERS/BUCKET holds the
# bucket's project; SCOPES/DIGEST what the bearer of a job credential may use (the SHA-256 of
# the token names it, so no file holds a token); TEAM_MARK says a team server (`aiptrain serve
# --tokens`) serves the tree, where a bucket of no project is nobody's (docs/reference/security.md).
PROJECTS_DIR = ".aiptrain-projects"
OWNERS, SCOPES, TEAM_MARK = "buckets", "scopes", "team"
MAX_RECORD_BYTES = 64 << 10
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
# gcloud's apitools sends resumable uploads to resumable/upload/storage/v1/, as Cloud Storage takes them.
API_PREFIXES = ("storage/v1/", "upload/storage/v1/", "resumable/upload/storage/v1/", "download/storage/v1/")


class ApiError(Exception):
    """An error answered as the JSON API answers it."""

    REASONS = {400: "invalid", 401: "required", 403: "forbidden", 404: "notFound", 405: "methodNotAllowed", 409: "conflict", 412: "conditionNotMet",
               413: "uploadTooLarge", 416: "requestedRangeNotSatisfiable", 501: "notImplemented"}

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code

    @classmethod
    def not_writable(cls, exc: PermissionError) -> ApiError:
        """403, which clients do not retry: a tree the endpoint's user may not write (a bucket or
        folder made by hand by another user) fails the write at once, naming the fix, instead of
        TensorFlow retrying a 500 for minutes."""
        return cls(403, f"aiptrain's storage endpoint (uid {os.geteuid()}) may not write here ({exc.strerror}"
                        f"{': ' + exc.filename if exc.filename else ''}): a bucket or folder under $AIPTRAIN_HOME/gcs "
                        "was made by another user; make them with aiptrain's gsutil or gcloud storage, or chown them "
                        "to that uid")

    def body(self) -> dict:
        reason = self.REASONS.get(self.code, "backendError")
        return {"error": {"code": self.code, "message": str(self),
                          "errors": [{"message": str(self), "domain": "global", "reason": reason}]}}


class Scope:
    """What one caller may use: the buckets of its projects (ANY: every project's), buckets
    shared with it by name (writable or not), and buckets of no project where `unowned` (a
    tree no team server serves). `read_only`: nothing written, whatever the bucket."""

    ANY = "*"

    def __init__(self, principal: str, projects, shared=None, read_only: bool = False, unowned: bool = False):
        self.principal = principal
        self.projects = frozenset(projects)
        self.shared = dict(shared or {})  # bucket -> writable
        self.read_only = read_only
        self.unowned = unowned

    @classmethod
    def from_record(cls, record: dict, unowned: bool) -> Scope:
        """A job credential's scope as its SCOPES file holds it: {"project": P, "buckets": {B: writable}}."""
        return cls(f"{record['project']}@aiptrain-jobs", [record["project"]], record.get("buckets"),
                   unowned=unowned)

    def reaches(self, project: str) -> bool:
        return self.ANY in self.projects or project in self.projects

    def may(self, bucket: str, owner: str | None, write: bool) -> bool:
        """Whether this caller may read (or write) `bucket`, which `owner` owns (None: no project)."""
        if write and self.read_only:
            return False
        if bucket in self.shared and (self.shared[bucket] or not write):
            return True
        if owner is None:
            return self.unowned or self.ANY in self.projects
        return self.reaches(owner)

    def project_for_new_bucket(self, asked: str | None) -> str | None:
        """The project a bucket this caller creates goes to: the one it names (which it must
        reach), else its only project; None: a bucket of no project (a tree of no team)."""
        if asked:
            if not self.reaches(asked) or self.read_only:
                raise ApiError(403, f"{self.principal} does not have storage.buckets.create access to the "
                                    f"Google Cloud project {asked}.")
            return asked
        mine = sorted(self.projects - {self.ANY})
        if len(mine) == 1 and self.ANY not in self.projects:
            return mine[0]
        if self.unowned or self.ANY in self.projects:
            return None
        raise ApiError(400, "Required parameter: project")

    def denied(self, permission: str, what: str) -> ApiError:
        """403 as Cloud Storage words it, and why where it is not the bucket's project."""
        why = " (the caller's token is read-only)" if self.read_only and not permission.endswith((".get", ".list")) \
            else ""
        return ApiError(403, f"{self.principal} does not have {permission} access to the Google Cloud Storage "
                             f"{what}{why}. Permission '{permission}' denied on resource (or it may not exist).")


OPEN_SCOPE = Scope("allUsers", [Scope.ANY], unowned=True)  # a tree served to one user: everything


# -- checksums: what google-cloud-storage validates an upload against ----------------------------

def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


def _crc32c_of(fd: int) -> int:
    """CRC32C (Castagnoli) of a file: google-crc32c's C code where the image has it (every
    runtime image with google-cloud-storage), else a table in Python (slower, same answer)."""
    if google_crc32c is not None:
        checksum = google_crc32c.Checksum()
        for block in iter(lambda: os.read(fd, BLOCK), b""):
            checksum.update(block)
        return int.from_bytes(checksum.digest(), "big")
    table, crc = _CRC32C_TABLE, 0xFFFFFFFF
    for block in iter(lambda: os.read(fd, BLOCK), b""):
        for byte in block:
            crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


_CRC32C_TABLE = _crc32c_table()


def checksums(path: str) -> dict[str, str]:
    """md5Hash and crc32c (base64, as the JSON API gives them) of a stored file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        md5 = hashlib.md5()
        for block in iter(lambda: os.read(fd, BLOCK), b""):
            md5.update(block)
        os.lseek(fd, 0, os.SEEK_SET)
        crc = _crc32c_of(fd)
    finally:
        os.close(fd)
    return {"md5Hash": base64.b64encode(md5.digest()).decode(),
            "crc32c": base64.b64encode(crc.to_bytes(4, "big")).decode()}


# -- the tree -----------------------------------------------------------------------------------


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def check_bucket(bucket: str) -> str:
    if not BUCKET_NAME.match(bucket) or ".." in bucket:
        raise ApiError(400, f"Invalid bucket name: '{bucket}'")
    return bucket


def object_parts(name: str) -> list[str]:
    """An object name's path components. Names that a directory tree cannot hold as the same
    object ('.', '..', empty components, NUL) are refused, never resolved."""
    if not name or "\0" in name or len(name.encode()) > 1024:
        raise ApiError(400, f"Invalid object name: '{name}'")
    parts = name.rstrip("/").split("/") if name != "/" else []
    if not parts or any(part in ("", ".", "..") for part in parts) or parts[0] == UPLOADS_DIR:
        raise ApiError(400, f"Invalid object name: '{name}': aiptrain keeps objects as files, so no empty, '.' "
                            "or '..' path segments")
    return parts


class Tree:
    """Buckets and objects as directories and files under `root`. Every path is walked one
    component at a time from a directory descriptor with O_NOFOLLOW: a link is never followed."""

    def __init__(self, root: str, owner: tuple[int, int] | None = None, make: bool = True):
        """`owner`: uid and gid to hand what is created to (the replicas' user, when the host's
        `aiptrain serve` runs this tree as root), so the endpoint in the replicas' container may
        write beside it; None: created as whoever runs this. `make`: the root and its uploads
        directory made now (not for a look that must leave nothing behind)."""
        self.root = os.path.abspath(root)
        self.owner = owner
        self.uploads = os.path.join(self.root, UPLOADS_DIR)
        for path in (self.root, self.uploads) if make else ():
            if not os.path.isdir(path):
                os.makedirs(path, exist_ok=True)
                self._hand_over(path)

    def _hand_over(self, name: str, dir_fd: int | None = None) -> None:
        if self.owner is not None:
            os.chown(name, *self.owner, dir_fd=dir_fd, follow_symlinks=False)

    # who owns what (PROJECTS_DIR)

    def _records_dir(self, kind: str, create: bool = False) -> int:
        return self._open_dir([PROJECTS_DIR, kind], create=create)

    def read_record(self, kind: str, name: str) -> str | None:
        """A record's text, bounded and through no link; None when there is none."""
        try:
            records = self._records_dir(kind)
        except OSError:
            return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=records)
        except OSError:
            return None
        finally:
            os.close(records)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            return handle.read(MAX_RECORD_BYTES).decode(errors="replace")

    def write_record(self, kind: str, name: str, text: str) -> None:
        """A record, whole or not at all (written aside, then renamed into place)."""
        records = self._records_dir(kind, create=True)
        try:
            partial = f".{name}.{secrets.token_hex(4)}"
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=records)
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            self._hand_over(partial, records)
            os.replace(partial, name, src_dir_fd=records, dst_dir_fd=records)
        finally:
            os.close(records)

    def owner_of(self, bucket: str) -> str | None:
        """The project `bucket` belongs to; None: no project (made before buckets had one)."""
        owner = self.read_record(OWNERS, bucket)
        return owner.strip() or None if owner is not None else None

    def set_owner(self, bucket: str, project: str) -> None:
        self.write_record(OWNERS, check_bucket(bucket), project + "\n")

    @property
    def team(self) -> bool:
        """Whether a team server serves this tree: buckets of no project are then nobody's."""
        try:
            os.stat(os.path.join(self.root, PROJECTS_DIR, TEAM_MARK), follow_symlinks=False)
            return True
        except OSError:
            return False

    def mark_team(self) -> None:
        """Say that a team server serves this tree (`team`)."""
        records = self._open_dir([PROJECTS_DIR], create=True)
        try:
            os.close(os.open(TEAM_MARK, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644, dir_fd=records))
        finally:
            os.close(records)

    def scope_of(self, token: str) -> Scope | None:
        """The scope a job credential grants (SCOPES/sha256(token)); None for a token of no job."""
        record = self.read_record(SCOPES, hashlib.sha256(token.encode()).hexdigest())
        try:
            data = json.loads(record) if record else None
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("project"), str):
            return None
        return Scope.from_record(data, unowned=not self.team)

    # descriptors

    def _open_dir(self, parts: list[str], create: bool = False) -> int:
        """A descriptor of the directory ROOT/parts..., made when `create`; ENOENT/ENOTDIR otherwise."""
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            return self._open_dir_at(root, parts, create, self.owner)
        finally:
            os.close(root)

    def bucket_exists(self, bucket: str) -> bool:
        try:
            os.close(self._open_dir([check_bucket(bucket)]))
            return True
        except OSError:
            return False

    def _bucket_fd(self, bucket: str) -> int:
        try:
            return self._open_dir([check_bucket(bucket)])
        except OSError:
            raise ApiError(404, f"The specified bucket does not exist: {bucket}") from None

    def open_object(self, bucket: str, name: str) -> tuple[int, os.stat_result]:
        """(descriptor, stat) of a regular file; a directory-marker name ('d/') of an empty
        directory gives its stat and -1, as listings show only empty directories' markers (a
        directory that holds objects is implied by them, as on Cloud Storage, where `gcloud
        storage ls gs://b/d/` would otherwise print d/ as an object too). 404 for anything else."""
        parts = object_parts(name)
        bucket_fd = self._bucket_fd(bucket)
        try:
            parent = self._open_dir_at(bucket_fd, parts[:-1])
            try:
                if name.endswith("/"):
                    info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode) and self._empty_dir(parent, parts[-1]):
                        return -1, info
                else:
                    fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=parent)
                    info = os.fstat(fd)
                    if stat.S_ISREG(info.st_mode):
                        return fd, info
                    os.close(fd)
            finally:
                os.close(parent)
        except OSError:
            pass
        finally:
            os.close(bucket_fd)
        raise ApiError(404, f"No such object: {bucket}/{name}")

    @staticmethod
    def _empty_dir(parent: int, name: str) -> bool:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
        try:
            with os.scandir(fd) as entries:
                return next(entries, None) is None
        finally:
            os.close(fd)

    @staticmethod
    def _open_dir_at(fd: int, parts: list[str], create: bool = False, owner: tuple[int, int] | None = None) -> int:
        """A descriptor of the directory fd/parts..., walked one part at a time through no link;
        directories it makes are handed to `owner`."""
        current = os.dup(fd)
        try:
            for part in parts:
                if create:
                    try:
                        os.mkdir(part, 0o755, dir_fd=current)
                        if owner is not None:
                            os.chown(part, *owner, dir_fd=current, follow_symlinks=False)
                    except FileExistsError:
                        pass
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=current)
                os.close(current)
                current = child
        except BaseException:
            os.close(current)
            raise
        return current

    def stat_object(self, bucket: str, name: str) -> dict:
        fd, info = self.open_object(bucket, name)
        if fd >= 0:
            os.close(fd)
        return self.resource(bucket, name, info)

    def resource(self, bucket: str, name: str, info: os.stat_result) -> dict:
        size = 0 if stat.S_ISDIR(info.st_mode) else info.st_size
        generation = str(info.st_mtime_ns // 1000)
        encoded = quote(name, safe="")
        return {
            "kind": "storage#object", "id": f"{bucket}/{name}/{generation}", "name": name, "bucket": bucket,
            "selfLink": f"https://www.googleapis.com/storage/v1/b/{bucket}/o/{encoded}",
            "mediaLink": f"https://storage.googleapis.com/download/storage/v1/b/{bucket}/o/{encoded}"
                         f"?generation={generation}&alt=media",
            "generation": generation, "metageneration": "1", "contentType": "application/octet-stream",
            "storageClass": "STANDARD", "size": str(size), "etag": f"CK{generation}=",
            "timeCreated": _rfc3339(info.st_mtime), "updated": _rfc3339(info.st_mtime),
            "timeStorageClassUpdated": _rfc3339(info.st_mtime),
        }

    def bucket_resource(self, bucket: str) -> dict:
        fd = self._bucket_fd(bucket)
        try:
            info = os.fstat(fd)
        finally:
            os.close(fd)
        owner = self.owner_of(bucket)
        return {"kind": "storage#bucket", "id": bucket, "name": bucket, "location": "US-CENTRAL1",
                **({"labels": {"aiptrain-project": owner}} if owner else {}),
                "locationType": "region", "storageClass": "STANDARD", "metageneration": "1", "etag": "CAE=",
                "projectNumber": "0", "selfLink": f"https://www.googleapis.com/storage/v1/b/{bucket}",
                "timeCreated": _rfc3339(info.st_mtime), "updated": _rfc3339(info.st_mtime)}

    # listing

    def buckets(self) -> list[str]:
        return sorted(n for n in os.listdir(self.root)
                      if BUCKET_NAME.match(n) and os.path.isdir(os.path.join(self.root, n))
                      and not os.path.islink(os.path.join(self.root, n)))

    def entries(self, bucket: str, prefix: str, delimiter: str) -> list[tuple[str, os.stat_result | None]]:
        """(name, stat) of each object under `prefix`, and (common prefix, None) with delimiter '/',
        sorted by name. Only the directory that holds `prefix` is walked from."""
        bucket_fd = self._bucket_fd(bucket)
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        try:
            start = self._open_dir_at(bucket_fd, base.split("/") if base else [])
        except (OSError, ApiError):
            return []
        finally:
            os.close(bucket_fd)
        found: list[tuple[str, os.stat_result | None]] = []
        self._walk(start, base + "/" if base else "", prefix, delimiter == "/", found)
        found.sort(key=lambda entry: entry[0].encode())
        return found

    def _walk(self, fd: int, at: str, prefix: str, one_level: bool, found: list) -> None:
        try:
            names = os.listdir(fd)
            if not names and at and at.startswith(prefix):
                found.append((at, os.fstat(fd)))  # an empty directory: its marker object
            for name in names:
                if not at and name == UPLOADS_DIR:
                    continue
                path = at + name
                if not (path.startswith(prefix) or prefix.startswith(path + "/")):
                    continue
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode) and path.startswith(prefix):
                    found.append((path, info))
                elif stat.S_ISDIR(info.st_mode):
                    if one_level and (path + "/").startswith(prefix) and len(path) >= len(prefix):
                        found.append((path + "/", None))
                        continue
                    try:
                        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    except OSError:
                        continue
                    self._walk(child, path + "/", prefix, one_level, found)
        finally:
            os.close(fd)

    # writing

    def new_upload(self) -> tuple[str, str]:
        upload_id = secrets.token_hex(16)
        path = os.path.join(self.uploads, upload_id)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
        self._hand_over(path)  # renamed into place by commit: the object is the owner's too
        return upload_id, path

    def commit(self, partial: str, bucket: str, name: str, if_generation_match: str | None) -> dict:
        """Move a finished upload into place (a reader never sees half an object)."""
        parts = object_parts(name)
        try:  # a bucket is a directory made by the first write, as on the host (nobody creates it first)
            bucket_fd = self._open_dir([check_bucket(bucket)], create=True)
        except OSError:
            os.unlink(partial)
            raise ApiError(404, f"The specified bucket does not exist: {bucket}") from None
        try:
            self._check_precondition(bucket, name, if_generation_match)
            try:
                parent = self._open_dir_at(bucket_fd, parts[:-1], create=True, owner=self.owner)
            except PermissionError as exc:
                raise ApiError.not_writable(exc) from None
            except OSError:
                raise ApiError(409, f"Cannot store {bucket}/{name}: a part of its name is an object here") from None
            try:
                if name.endswith("/"):  # a directory marker: the directory itself
                    try:
                        os.mkdir(parts[-1], 0o755, dir_fd=parent)
                        self._hand_over(parts[-1], parent)
                    except FileExistsError:
                        pass
                    os.unlink(partial)
                    info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
                    if not stat.S_ISDIR(info.st_mode):
                        raise ApiError(409, f"Cannot store {bucket}/{name}: an object of that name exists")
                    return self.resource(bucket, name, info)
                try:
                    existing = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
                    if stat.S_ISDIR(existing.st_mode):
                        raise ApiError(409, f"Cannot store {bucket}/{name}: objects exist under {name}/ here")
                except FileNotFoundError:
                    pass
                sums = checksums(partial)  # before it is in place: the file is ours alone
                os.replace(partial, parts[-1], dst_dir_fd=parent)
                info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
                return {**self.resource(bucket, name, info), **sums}
            finally:
                os.close(parent)
        finally:
            os.close(bucket_fd)
            if os.path.exists(partial):
                os.unlink(partial)

    def _check_precondition(self, bucket: str, name: str, if_generation_match: str | None) -> None:
        if if_generation_match is None:
            return
        try:
            current = self.stat_object(bucket, name)["generation"]
        except ApiError:
            current = "0"
        if current != if_generation_match:
            raise ApiError(412, "At least one of the pre-conditions you specified did not hold.")

    def delete(self, bucket: str, name: str) -> None:
        parts = object_parts(name)
        bucket_fd = self._bucket_fd(bucket)
        try:
            parent = self._open_dir_at(bucket_fd, parts[:-1])
        except OSError:
            raise ApiError(404, f"No such object: {bucket}/{name}") from None
        finally:
            os.close(bucket_fd)
        try:
            if name.endswith("/"):
                os.rmdir(parts[-1], dir_fd=parent)
            else:
                info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    raise FileNotFoundError
                os.unlink(parts[-1], dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY:
                return  # a marker over objects: the objects keep the "directory"
            raise ApiError(404, f"No such object: {bucket}/{name}") from None
        finally:
            os.close(parent)
        self._prune(bucket, parts[:-1])

    def _prune(self, bucket: str, parts: list[str]) -> None:
        """Directories a delete left empty go, as no object implies them any more (up to the bucket)."""
        while parts:
            try:
                parent = self._open_dir([bucket, *parts[:-1]])
            except OSError:
                return
            try:
                os.rmdir(parts[-1], dir_fd=parent)
            except OSError:
                return
            finally:
                os.close(parent)
            parts = parts[:-1]

    def copy(self, source_bucket: str, source: str, bucket: str, name: str) -> dict:
        fd, _ = self.open_object(source_bucket, source)
        if fd < 0:
            raise ApiError(400, "Directory markers cannot be copied")
        upload_id, partial = self.new_upload()
        try:
            with os.fdopen(fd, "rb") as reader, open(partial, "wb") as writer:
                shutil.copyfileobj(reader, writer, BLOCK)
        except BaseException:
            os.unlink(partial)
            raise
        return self.commit(partial, bucket, name, None)

    def create_bucket(self, bucket: str, project: str | None) -> dict:
        """A bucket of `project` (None: of no project)."""
        try:
            os.mkdir(os.path.join(self.root, check_bucket(bucket)), 0o755)
            self._hand_over(os.path.join(self.root, bucket))
        except FileExistsError:
            if project is not None and self.owner_of(bucket) == project:
                raise ApiError(409, f"Your previous request to create the named bucket succeeded and you already "
                                    f"own it: {bucket}") from None
            raise ApiError(409, f"The requested bucket name is not available: {bucket}. The bucket namespace is "
                                "shared by all users of the system. Please select a different name and try again.") from None
        if project is not None:
            self.set_owner(bucket, project)
        return self.bucket_resource(bucket)

    def delete_bucket(self, bucket: str) -> None:
        self._bucket_fd(bucket)
        try:
            os.rmdir(os.path.join(self.root, bucket))
        except OSError:
            raise ApiError(409, f"The bucket you tried to delete is not empty: {bucket}") from None
        try:
            records = self._records_dir(OWNERS)
        except OSError:
            return
        try:
            os.unlink(bucket, dir_fd=records)
        except FileNotFoundError:
            pass
        finally:
            os.close(records)


# -- HTTP -------------------------------------------------------------------------------------------


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """`bytes=a-b`, `bytes=a-`, `bytes=-n` as (first, last) inclusive; None for the whole
    object; 416 past its end."""
    if not header or not header.startswith("bytes="):
        return None
    first, _, last = header[len("bytes="):].split(",")[0].strip().partition("-")
    try:
        if first == "":
            start, end = max(0, size - int(last)), size - 1
        else:
            start, end = int(first), min(int(last), size - 1) if last else size - 1
    except ValueError:
        return None
    if start >= size or start > end:
        raise ApiError(416, "Request range not satisfiable")
    return start, end


class Uploads:
    """Resumable upload sessions: the bytes go to a file under the tree's upload directory."""

    def __init__(self):
        self.sessions: dict[str, dict] = {}
        self.lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "aiptrain-storage"
    tree: Tree
    uploads: Uploads
    scheme = "https"  # of the upload session URLs it hands out
    fixed_scope: Scope | None = None  # every caller's, instead of its bearer token's (a tree of one user)
    _request_scope: Scope | None = None

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        # Read here, not in aiptrain.settings: this file runs on its own in the endpoint's container.
        if os.environ.get("AIPTRAIN_STORAGE_LOG"):
            super().log_message(format, *args)

    def setup(self) -> None:
        self.shaken = shake_hands(self.request)
        super().setup()

    def handle(self) -> None:
        if self.shaken:  # else nothing to answer, and nothing to say in the log
            super().handle()

    # plumbing

    def _route(self) -> tuple[list[str], dict[str, str]]:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        return url.path.lstrip("/").split("/"), query

    def _body_chunks(self):
        """The request body as it arrives, chunked transfer coding undone (TensorFlow sends its
        uploads chunked)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return
                yield from self._exactly(size)
                self.rfile.readline(3)
        else:
            yield from self._exactly(int(self.headers.get("Content-Length") or 0))

    def _exactly(self, remaining: int):
        """The next `remaining` bytes of the request body, a block at a time (fewer if the
        client hangs up)."""
        while remaining:
            block = self.rfile.read(min(BLOCK, remaining))
            if not block:
                return
            remaining -= len(block)
            yield block

    def _small_body(self) -> bytes:
        body = b""
        for block in self._body_chunks():
            body += block
            if len(body) > MAX_METADATA_BYTES:
                raise ApiError(413, "Request metadata too large")
        return body

    def _json_body(self) -> dict:
        body = self._small_body()
        try:
            return json.loads(body) if body.strip() else {}
        except ValueError:
            raise ApiError(400, "Invalid JSON payload") from None

    def _send_json(self, code: int, value: dict, headers: dict | None = None) -> None:
        data = json.dumps(value).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        for key, header in (headers or {}).items():
            self.send_header(key, header)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_empty(self, code: int, headers: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()

    def _dispatch(self) -> None:
        try:
            self._handle()
        except ApiError as exc:
            self._drain()
            self._send_json(exc.code, exc.body())
        except PermissionError as exc:
            self._drain()
            self._send_json(403, ApiError.not_writable(exc).body())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - one request fails, the server carries on
            self._drain()
            self._send_json(500, ApiError(500, f"{type(exc).__name__}: {exc}").body())

    def _drain(self) -> None:
        """A request answered early still has its body on the connection: skip it (or close)."""
        if not getattr(self, "_body_read", True):
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _dispatch

    # who asks, and what it may do

    def scope(self) -> Scope:
        """The caller's scope, looked up once per request."""
        if self._request_scope is None:
            self._request_scope = self.fixed_scope or self.caller_scope()
        return self._request_scope

    def caller_scope(self) -> Scope:
        """The job credential the bearer token is (what replicas carry); 401 for none."""
        found = self.tree.scope_of(self._bearer()) if self._bearer() else None
        if found is None:
            raise ApiError(401, "Anonymous caller does not have storage access: a replica's clients carry its job's "
                                "credential (GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_AUTH_TOKEN_FOR_TESTING); one "
                                "that drops it (AnonymousCredentials, STORAGE_EMULATOR_HOST) is refused")
        return found

    def _bearer(self) -> str:
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" else ""

    def _allow(self, bucket: str, permission: str, what: str = "object", makes: bool = False) -> None:
        """403 unless the caller may do `permission` (storage.objects.get, ...) on `bucket`.
        A bucket that does not exist is the tree's to answer (404), or, where the request
        `makes` objects, made by it for the caller's project: a bucket is made by its first
        write here, as the host's staging makes it."""
        scope = self.scope()
        write = not permission.endswith((".get", ".list"))
        if write and scope.read_only:  # before a bucket is made for it
            raise scope.denied(permission, what)
        if not self.tree.bucket_exists(bucket):
            if makes:
                project = scope.project_for_new_bucket(None)
                with contextlib.suppress(ApiError):  # made meanwhile: its owner decides below
                    self.tree.create_bucket(bucket, project)
            else:
                return
        if not scope.may(bucket, self.tree.owner_of(bucket), write):
            raise scope.denied(permission, what)

    def _token(self) -> None:
        """OAuth 2.0's refresh, as oauth2.googleapis.com answers it: the credentials file in a
        replica (an authorized user whose refresh token is its job credential) asks for an
        access token, which is the job credential itself."""
        form = {k: v[-1] for k, v in parse_qs(self._small_body().decode(errors="replace")).items()}
        self._body_read = True
        token = form.get("refresh_token", "")
        if form.get("grant_type") != "refresh_token" or not token or self.tree.scope_of(token) is None:
            return self._send_json(400, {"error": "invalid_grant", "error_description": "Token has been expired or revoked."})
        self._send_json(200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer",
                              "scope": "https://www.googleapis.com/auth/devstorage.full_control"})

    # routes

    def _handle(self) -> None:
        self._body_read = self.command in ("GET", "HEAD", "DELETE")
        self._request_scope = None
        parts, query = self._route()
        if parts[:2] == ["resumable", "upload"]:
            parts = parts[1:]
        path = "/".join(parts)
        if self.command == "POST" and path in ("token", "o/oauth2/token", "oauth2/v4/token"):
            return self._token()
        if path.startswith("upload/storage/v1/b/"):
            return self._upload(parts[4], query)
        if path.startswith("download/storage/v1/b/") and len(parts) >= 7 and parts[5] == "o":
            self._allow(parts[4], "storage.objects.get")
            return self._media(parts[4], unquote("/".join(parts[6:])))
        if path.startswith("storage/v1/b"):
            return self._json_api(parts[3:], query)
        if path.startswith("batch/") and self.command == "POST":
            return self._batch()
        # The XML API's object GET (storage.googleapis.com/BUCKET/NAME): how TensorFlow reads.
        if len(parts) >= 2 and parts[1] and self.command in ("GET", "HEAD"):
            self._allow(parts[0], "storage.objects.get")
            return self._media(parts[0], unquote("/".join(parts[1:])))
        raise ApiError(404, f"Not found: /{path}")

    def _json_api(self, rest: list[str], query: dict) -> None:
        method = self.command
        if not rest or rest == [""]:  # /storage/v1/b
            if method == "GET":
                return self._list_buckets(query.get("project"))
            if method == "POST":
                name = self._json_body().get("name") or query.get("name", "")
                self._body_read = True
                project = self.scope().project_for_new_bucket(query.get("project"))
                return self._send_json(200, self.tree.create_bucket(name, project))
            raise ApiError(405, "Method not allowed")
        bucket = unquote(rest[0])
        if len(rest) == 1:
            if method in ("GET", "HEAD"):
                self._allow(bucket, "storage.buckets.get", "bucket")
                return self._send_json(200, self.tree.bucket_resource(bucket))
            if method == "PATCH":
                self._allow(bucket, "storage.buckets.update", "bucket")
                self._small_body()
                self._body_read = True
                return self._send_json(200, self.tree.bucket_resource(bucket))
            if method == "DELETE":
                self._allow(bucket, "storage.buckets.delete", "bucket")
                self.tree.delete_bucket(bucket)
                return self._send_empty(204)
            raise ApiError(405, "Method not allowed")
        if rest[1] != "o":
            raise ApiError(501, f"/storage/v1/b/{bucket}/{rest[1]} is not supported by aiptrain's storage endpoint")
        if len(rest) == 2 or rest[2:] == [""]:
            if method == "GET":
                self._allow(bucket, "storage.objects.list", "bucket")
                return self._list(bucket, query)
            raise ApiError(405, "Method not allowed")
        tail = "/".join(rest[2:])
        for verb in ("rewriteTo", "copyTo"):
            marker = f"/{verb}/b/"
            if marker in tail and method == "POST":
                return self._copy(bucket, tail, marker, verb == "rewriteTo")
        if tail == "compose" or tail.endswith("/compose"):
            self._allow(bucket, "storage.objects.create", makes=True)
            return self._compose(bucket, unquote(tail[: -len("compose")].rstrip("/")))
        name = unquote(tail)
        if method in ("GET", "HEAD"):
            self._allow(bucket, "storage.objects.get")
            if query.get("alt") == "media":
                return self._media(bucket, name)
            return self._send_json(200, self.tree.stat_object(bucket, name))
        if method == "DELETE":
            self._allow(bucket, "storage.objects.delete")
            self.tree.delete(bucket, name)
            return self._send_empty(204)
        if method in ("PATCH", "PUT"):
            self._allow(bucket, "storage.objects.update")
            self._small_body()
            self._body_read = True
            return self._send_json(200, self.tree.stat_object(bucket, name))
        raise ApiError(405, "Method not allowed")

    def _list_buckets(self, project: str | None) -> None:
        """The buckets of `project` the caller may read (all it may read, when none is named)."""
        scope = self.scope()
        if project and not scope.reaches(project):
            raise ApiError(403, f"{scope.principal} does not have storage.buckets.list access to the Google Cloud "
                                f"project {project}.")
        owners = {bucket: self.tree.owner_of(bucket) for bucket in self.tree.buckets()}
        items = [self.tree.bucket_resource(bucket) for bucket, owner in owners.items()
                 if scope.may(bucket, owner, write=False) and (not project or owner in (project, None))]
        self._send_json(200, {"kind": "storage#buckets", **({"items": items} if items else {})})

    def _list(self, bucket: str, query: dict) -> None:
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        if delimiter not in ("", "/"):
            raise ApiError(501, "aiptrain's storage endpoint lists with delimiter '/' or none")
        page_size = min(int(query.get("maxResults") or PAGE_SIZE), PAGE_SIZE) or PAGE_SIZE
        after = base64.urlsafe_b64decode(query["pageToken"]).decode() if query.get("pageToken") else None
        start, end = query.get("startOffset", ""), query.get("endOffset", "")
        entries = [(n, i) for n, i in self.tree.entries(bucket, prefix, delimiter)
                   if (after is None or n.encode() > after.encode()) and n >= start and (not end or n < end)]
        page = entries[:page_size]
        answer: dict = {"kind": "storage#objects"}
        items = [self.tree.resource(bucket, name, info) for name, info in page if info is not None]
        prefixes = [name for name, info in page if info is None]
        if items:
            answer["items"] = items
        if prefixes:
            answer["prefixes"] = prefixes
        if len(entries) > page_size:
            answer["nextPageToken"] = base64.urlsafe_b64encode(page[-1][0].encode()).decode()
        self._send_json(200, answer)

    def _media(self, bucket: str, name: str) -> None:
        fd, info = self.tree.open_object(bucket, name)
        if fd < 0:
            self._send_empty(200, {"Content-Type": "application/octet-stream"})
            return
        with os.fdopen(fd, "rb") as handle:
            size = info.st_size
            span = parse_range(self.headers.get("Range"), size) if size else None
            first, last = span or (0, size - 1)
            length = last - first + 1 if size else 0
            self.send_response(206 if span else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(length))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("X-Goog-Generation", str(info.st_mtime_ns // 1000))
            self.send_header("X-Goog-Stored-Content-Length", str(size))
            if span:
                self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.end_headers()
            if self.command == "HEAD":
                return
            handle.seek(first)
            while length > 0:
                block = handle.read(min(BLOCK, length))
                if not block:
                    break
                self.wfile.write(block)
                length -= len(block)

    BATCH_REQUEST = re.compile(r"^(DELETE) /storage/v1/b/([^/\s]+)/o/([^?\s]+)\S* HTTP/1\.1", re.M)

    def _batch(self) -> None:
        """A batch of object deletes (gcsfs removes many files so), answered part by part."""
        body = self._small_body().decode(errors="replace")
        self._body_read = True
        parts = []
        for _, bucket, name in self.BATCH_REQUEST.findall(body):
            try:
                self._allow(unquote(bucket), "storage.objects.delete")
                self.tree.delete(unquote(bucket), unquote(name))
                parts.append("HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
            except ApiError as exc:
                error = json.dumps(exc.body())
                parts.append(f"HTTP/1.1 {exc.code} Error\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(error)}\r\n\r\n{error}")
        boundary = "batch_aiptrain"
        data = "".join(f"--{boundary}\r\nContent-Type: application/http\r\nContent-ID: <response-{i + 1}>\r\n\r\n"
                       f"{part}\r\n" for i, part in enumerate(parts)) + f"--{boundary}--\r\n"
        encoded = data.encode()
        self.send_response(200)
        self.send_header("Content-Type", f"multipart/mixed; boundary={boundary}")
        self.send_header("Content-Length", str(len(encoded)))
        self.end_headers()
        self.wfile.write(encoded)

    def _copy(self, bucket: str, tail: str, marker: str, rewrite: bool) -> None:
        source, _, target = tail.partition(marker)
        target_bucket, _, target_name = target.partition("/o/")
        self._allow(bucket, "storage.objects.get")
        self._allow(unquote(target_bucket), "storage.objects.create", makes=True)
        self._small_body()  # metadata for the copy: not kept
        self._body_read = True
        resource = self.tree.copy(bucket, unquote(source), unquote(target_bucket), unquote(target_name))
        if not rewrite:
            return self._send_json(200, resource)
        self._send_json(200, {"kind": "storage#rewriteResponse", "totalBytesRewritten": resource["size"],
                              "objectSize": resource["size"], "done": True, "resource": resource})

    def _compose(self, bucket: str, name: str) -> None:
        request = self._json_body()
        self._body_read = True
        upload_id, partial = self.tree.new_upload()
        with open(partial, "wb") as writer:
            for source in request.get("sourceObjects") or []:
                fd, _ = self.tree.open_object(bucket, source.get("name", ""))
                if fd < 0:
                    raise ApiError(400, "Directory markers cannot be composed")
                with os.fdopen(fd, "rb") as reader:
                    shutil.copyfileobj(reader, writer, BLOCK)
        self._send_json(200, self.tree.commit(partial, bucket, name, None))

    # uploads

    def _upload(self, bucket: str, query: dict) -> None:
        check_bucket(bucket)
        self._allow(bucket, "storage.objects.create", makes=self.command == "POST")
        kind = query.get("uploadType", "media")
        if self.command == "POST" and kind == "media":
            return self._finish_whole(bucket, query.get("name", ""), query, self._body_chunks())
        if self.command == "POST" and kind == "multipart":
            return self._multipart(bucket, query)
        if kind == "resumable" and self.command in ("PUT", "POST") and query.get("upload_id"):
            return self._continue_session(query["upload_id"])  # gcsfs sends the pieces with POST
        if kind == "resumable" and self.command == "POST":
            return self._start_session(bucket, query)
        if kind == "resumable" and self.command == "DELETE" and query.get("upload_id"):
            return self._cancel_session(query["upload_id"])
        raise ApiError(400, f"Unsupported upload: uploadType={kind} with {self.command}")

    def _finish_whole(self, bucket: str, name: str, query: dict, chunks) -> None:
        if not name:
            raise ApiError(400, "Required parameter: name")
        object_parts(name)
        upload_id, partial = self.tree.new_upload()
        try:
            with open(partial, "wb") as writer:
                for block in chunks:
                    writer.write(block)
        except BaseException:
            os.unlink(partial)
            raise
        self._body_read = True
        self._send_json(200, self.tree.commit(partial, bucket, name, query.get("ifGenerationMatch")))

    def _multipart(self, bucket: str, query: dict) -> None:
        """multipart/related: a JSON part (the object's metadata, its name), then the media part.
        Multipart uploads are small by the clients' rules (resumable above 8 MB), so the body
        is parsed in memory, bounded."""
        body = b"".join(self._limited_chunks(256 << 20))
        parts = multipart_parts(self.headers.get("Content-Type") or "", body)
        if len(parts) < 2:
            raise ApiError(400, "A multipart upload needs a metadata part and a media part")
        try:
            metadata = json.loads(parts[0][1] or b"{}")
        except ValueError:
            raise ApiError(400, "The metadata part of a multipart upload is not JSON") from None
        if not isinstance(metadata, dict):
            raise ApiError(400, "The metadata part of a multipart upload is not a JSON object")
        self._finish_whole(bucket, metadata.get("name") or query.get("name", ""), query, [parts[1][1]])

    def _limited_chunks(self, limit: int):
        total = 0
        for block in self._body_chunks():
            total += len(block)
            if total > limit:
                raise ApiError(413, "Multipart uploads above 256 MB: use a resumable upload")
            yield block

    def _start_session(self, bucket: str, query: dict) -> None:
        metadata = self._json_body()
        self._body_read = True
        name = metadata.get("name") or query.get("name", "")
        if not name:
            raise ApiError(400, "Required parameter: name")
        object_parts(name)
        upload_id, partial = self.tree.new_upload()
        with self.uploads.lock:
            self.uploads.sessions[upload_id] = {"bucket": bucket, "name": name, "partial": partial,
                                                "if_generation_match": query.get("ifGenerationMatch")}
        host = self.headers.get("Host") or "storage.googleapis.com"
        location = (f"{self.scheme}://{host}/upload/storage/v1/b/{bucket}/o?uploadType=resumable"
                    f"&name={quote(name, safe='')}&upload_id={upload_id}")
        self._send_empty(200, {"Location": location, "X-GUploader-UploadID": upload_id})

    def _continue_session(self, upload_id: str) -> None:
        """One PUT of a resumable upload: `Content-Range: bytes FIRST-LAST/TOTAL` (TOTAL `*` while
        unknown), `bytes */TOTAL` to ask how much arrived, or no range: the whole object."""
        with self.uploads.lock:
            session = self.uploads.sessions.get(upload_id)
        if session is None:
            raise ApiError(404, "No such upload session (it ended, or the endpoint restarted)")
        content_range = (self.headers.get("Content-Range") or "").strip()
        match = re.fullmatch(r"bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)", content_range)
        if content_range and not match:
            raise ApiError(400, f"Invalid Content-Range: {content_range}")
        received = os.path.getsize(session["partial"])
        total = match.group(3) if match else None
        if match and match.group(1) is not None:
            first = int(match.group(1))
            if first > received:
                raise ApiError(400, f"Content-Range starts at {first} but {received} bytes arrived")
            with open(session["partial"], "r+b") as writer:
                writer.seek(first)
                for block in self._body_chunks():
                    writer.write(block)
                writer.truncate()
            received = os.path.getsize(session["partial"])
        elif not match:
            with open(session["partial"], "wb") as writer:
                for block in self._body_chunks():
                    writer.write(block)
            received = os.path.getsize(session["partial"])
            total = str(received)
        else:
            self._small_body()
        self._body_read = True
        if total not in (None, "*") and received >= int(total):
            with self.uploads.lock:
                self.uploads.sessions.pop(upload_id, None)
            resource = self.tree.commit(session["partial"], session["bucket"], session["name"],
                                        session["if_generation_match"])
            return self._send_json(200, resource)
        headers = {"Range": f"bytes=0-{received - 1}"} if received else {}
        self._send_empty(308, headers)

    def _cancel_session(self, upload_id: str) -> None:
        with self.uploads.lock:
            session = self.uploads.sessions.pop(upload_id, None)
        if session and os.path.exists(session["partial"]):
            os.unlink(session["partial"])
        self._send_empty(499 if session else 404)


def multipart_boundary(content_type: str) -> bytes | None:
    """The boundary of a multipart Content-Type, unquoted. gcloud's apitools writes it with
    Python's repr (`boundary='===...=='`), which the email package does not unquote and Cloud
    Storage takes; google-cloud-storage writes it in double quotes, RFC 2046 allows it bare."""
    match = re.search(r"""(?:^|;)\s*boundary\s*=\s*("[^"]*"|'[^']*'|[^;\s]+)""", content_type, re.I)
    if not match:
        return None
    value = match.group(1)
    if value[:1] in "\"'" and value[-1:] == value[:1] and len(value) >= 2:
        value = value[1:-1]
    return value.encode("latin-1", "replace") or None


def multipart_parts(content_type: str, body: bytes) -> list[tuple[dict[str, str], bytes]]:
    """The parts of a multipart body as (headers with lower-case names, payload bytes), lines
    ending in CRLF (google-cloud-storage, googleapiclient) or LF alone (gcloud's apitools). The
    line break before each delimiter belongs to the delimiter (RFC 2046), so a payload keeps
    its own last newline. A `Content-Transfer-Encoding: base64` part is decoded."""
    boundary = multipart_boundary(content_type)
    if not content_type.lower().lstrip().startswith("multipart/") or boundary is None:
        return []
    delimiter = re.compile(rb"(?:\r?\n|^)--" + re.escape(boundary) + rb"(--)?[ \t]*(?:\r?\n|$)")
    parts, start = [], None
    for match in delimiter.finditer(body):
        if start is not None:
            parts.append(body[start:match.start()])
        if match.group(1):  # the close delimiter
            break
        start = match.end()
    return [_one_part(part) for part in parts]


def _one_part(part: bytes) -> tuple[dict[str, str], bytes]:
    if part.startswith((b"\r\n", b"\n")):  # no headers: the part starts with its blank line
        head, payload = b"", part[part.index(b"\n") + 1:]
    else:
        head, separator, payload = part.partition(b"\r\n\r\n")
        if not separator or b"\n\n" in head:
            head, _, payload = part.partition(b"\n\n")
    headers = {}
    for line in head.decode("latin-1").splitlines():
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    if headers.get("content-transfer-encoding", "").lower() == "base64":
        try:
            payload = base64.b64decode(payload)
        except ValueError:
            raise ApiError(400, "A base64 part of a multipart upload does not decode") from None
    return headers, payload


def serve(root: str, port: int, cert: str | None, key: str | None, listening: socket.socket | None = None) -> None:
    """Serve `root` on `port` (`listening`: the socket `listen_early` made, already said)."""
    os.umask(0o022)
    tree = Tree(root)
    for leftover in os.listdir(tree.uploads):  # sessions of a previous run cannot be resumed
        os.unlink(os.path.join(tree.uploads, leftover))
    handler = type("BoundHandler", (Handler,), {"tree": tree, "uploads": Uploads(),
                                                "scheme": "https" if cert else "http"})
    server = ThreadingHTTPServer(("0.0.0.0", port), handler, bind_and_activate=listening is None)
    server.daemon_threads = True
    if listening is None:
        server.socket = secured(server.socket, cert, key)
        say_serving(root, port)
    else:
        server.socket.close()  # made unbound by the constructor
        server.socket = listening
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    args = parser.parse_args(argv)
    serve(args.root, args.port, args.cert, args.key, EARLY_SOCKET)


if __name__ == "__main__":
    main()

"""A bucket that is a directory on this machine (the default, embedded setup)."""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import os
import shutil
import stat
from pathlib import Path

from aiptrain import safe_files
from aiptrain.errors import ValidationError
from aiptrain.safe_files import partial_name
from aiptrain.storage.urls import bucket_name, check_gcs_uri, object_name


def feed_file(digest, path: Path):
    """Update a hashlib object with a file's bytes, a megabyte at a time; return it. Only a
    regular file, never through a link at its name, never blocking (a FIFO is refused)."""
    fd = _open_regular(path)
    try:
        for block in iter(lambda: os.read(fd, 1 << 20), b""):
            digest.update(block)
    finally:
        os.close(fd)
    return digest


def _open_regular(path: Path, dir_fd: int | None = None) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            raise ValidationError(f"[{path}] is not a regular file (a link or a special file): not read.") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValidationError(f"[{path}] is not a regular file (a link or a special file): not read.")
    return fd


def md5_base64(path: Path) -> str:
    """A file's MD5 in the form Cloud Storage reports it (base64 of the digest)."""
    return base64.b64encode(feed_file(hashlib.md5(usedforsecurity=False), path).digest()).decode()


def link_or_copy(source: Path, target: Path) -> None:
    """A hard link when both are on one file system (no bytes copied), else a copy. Safe for
    staged files and objects: they are never modified in place. Only a regular file is taken,
    never through a link at its name."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        copy_regular(source, target)
        return
    if not stat.S_ISREG(os.lstat(target).st_mode):  # linked the link or FIFO itself: not a package
        os.unlink(target)
        raise ValidationError(f"[{source}] is not a regular file (a link or a special file): not taken.")


def copy_regular(source: Path, target: Path, source_dir_fd: int | None = None) -> None:
    fd = _open_regular(source, source_dir_fd)
    with os.fdopen(fd, "rb") as reader, open(target, "wb") as writer:
        shutil.copyfileobj(reader, writer, 1 << 20)


REPLICA_IDS = (65534, 65534)  # nobody: the replicas' user (and the storage endpoint's) when aiptrain runs as root


def give_to_replicas(root: Path, path: Path, whole_tree: bool = False) -> None:
    """When aiptrain runs as root, what it writes in the gcs tree is handed to the replicas' user,
    from `path` up to `root`, as every writer of a bucket may write beside any object: the
    storage endpoint writes as that user. Links are never followed (lchown; the walk does not
    enter linked directories). `whole_tree`: everything under `path` too."""
    if os.geteuid() != 0:
        return
    root = root.absolute()
    path = path.absolute()
    chain = [path, *(p for p in path.parents if p.is_relative_to(root))]
    for entry in chain:
        with contextlib.suppress(FileNotFoundError):
            os.lchown(entry, *REPLICA_IDS)
    if whole_tree or path.is_dir() and not path.is_symlink():
        for directory, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                with contextlib.suppress(FileNotFoundError):
                    os.lchown(os.path.join(directory, name), *REPLICA_IDS)


class LocalBucket:
    def __init__(self, root: Path):
        self.root = root.resolve()
        self.url = f"file://{self.root}"
        self.keep = self.root  # emptied directories are removed up to this one, not it

    def _object_path(self, path: str) -> Path:
        """The file for an object path; an object path can never leave the bucket root. Named,
        not resolved: what is inside a bucket may be a trainer's, so every operation below walks
        to it from the root through no link (aiptrain.safe_files)."""
        relative = os.path.normpath(path.lstrip("/"))
        if relative == ".":
            return self.root
        if relative == ".." or relative.startswith("../"):
            raise ValidationError(f"Object path [{path}] escapes the bucket [{self.url}]; use a path inside it.")
        return self.root / relative

    def object_file(self, path: str) -> Path:
        """The file that holds the object at `path` (which may not exist yet), for callers that
        work on paths: refused when links inside the bucket lead out of it."""
        target = self._object_path(path).resolve()
        if target != self.root and not target.is_relative_to(self.root):
            raise ValidationError(f"Object path [{path}] escapes the bucket [{self.url}]; use a path inside it.")
        return target

    @contextlib.contextmanager
    def _parent(self, target: Path, create: bool = False):
        """(descriptor of the target's directory, reached through no link from `keep`, and its
        name); with `create`, missing directories (the bucket's own too) are made."""
        if create:
            self.keep.mkdir(parents=True, exist_ok=True)
        if not target.parent.is_relative_to(self.keep):  # the bucket's own directory is a link out
            raise safe_files.UnsafePath(f"[{self.url}] is a link out of {self.keep}: remove it.")
        relative = target.parent.relative_to(self.keep)
        with safe_files.open_dir(self.keep, relative, create=create) as fd:
            yield fd, target.name

    def uri(self, path: str) -> str:
        return f"file://{self._object_path(path)}"

    def _missing(self, path: str) -> str:
        return f"[{self.uri(path)}] does not exist: check the path."

    def exists(self, path: str) -> bool:
        target = self._object_path(path)
        try:
            with self._parent(target) as (fd, name):
                return stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        except (OSError, ValidationError):
            return False

    def upload(self, source: Path, path: str) -> str:
        target = self._object_path(path)
        with self._parent(target, create=True) as (fd, name):
            # Written beside the target and renamed, so a reader never sees half an object; the
            # name is new (O_EXCL), so nothing a trainer put there is written through.
            partial = partial_name(name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial, dir_fd=fd)
            out = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
            with open(source, "rb") as reader, os.fdopen(out, "wb") as writer:
                shutil.copyfileobj(reader, writer, 1 << 20)
            os.replace(partial, name, src_dir_fd=fd, dst_dir_fd=fd)
        return self.uri(path)

    def copy(self, source: str, path: str, md5: str) -> str | None:
        original = self._object_path(source)
        if not self.exists(source) or self._md5(original) != md5:
            return None
        target = self._object_path(path)
        with self._parent(original) as (source_fd, source_name), self._parent(target, create=True) as (fd, name):
            partial = partial_name(name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial, dir_fd=fd)
            os.link(source_name, partial, src_dir_fd=source_fd, dst_dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISREG(os.stat(partial, dir_fd=fd, follow_symlinks=False).st_mode):
                os.unlink(partial, dir_fd=fd)  # replaced since the check: not an object
                return None
            os.replace(partial, name, src_dir_fd=fd, dst_dir_fd=fd)
        return self.uri(path)

    def _md5(self, target: Path) -> str | None:
        digest = hashlib.md5(usedforsecurity=False)
        try:
            with self._parent(target) as (fd, name):
                reader = _open_regular(Path(name), fd)
                try:
                    for block in iter(lambda: os.read(reader, 1 << 20), b""):
                        digest.update(block)
                finally:
                    os.close(reader)
        except (OSError, ValidationError):
            return None
        return base64.b64encode(digest.digest()).decode()

    def download(self, path: str, destination: Path) -> None:
        source = self._object_path(path)
        if not self.exists(path):
            raise ValidationError(self._missing(path))
        destination.parent.mkdir(parents=True, exist_ok=True)
        with self._parent(source) as (fd, name):
            copy_regular(Path(name), destination, fd)

    def delete_prefix(self, prefix: str) -> None:
        target = self._object_path(prefix)
        if target == self.root:
            raise ValidationError("Refusing to delete a whole bucket.")
        try:
            with self._parent(target) as (fd, name):
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(target)  # refuses a link at the top, follows none inside
                else:
                    os.unlink(name, dir_fd=fd)  # a file, or a link itself, never what it names
        except FileNotFoundError:
            pass
        # Drop parent directories the object left empty, up to the bucket root (`keep`).
        for parent in target.parents:
            if parent == self.keep or not parent.is_relative_to(self.keep):
                break
            try:
                parent.rmdir()
            except OSError:
                break


class LocalGcsBucket(LocalBucket):
    """A gs:// bucket kept on this machine (AIPTRAIN_GCS=local): its objects are the files under
    `<gcs root>/<bucket>/`, a directory made by the first write (nobody creates buckets here
    first). URLs stay gs://, so the job's record reads as it does on the service."""

    def __init__(self, gcs_root: Path, bucket_url: str, prefix: str = ""):
        name = bucket_name(bucket_url)
        super().__init__(gcs_root / name)
        self.url = f"gs://{name}"
        self.prefix = prefix.strip("/")
        self.keep = gcs_root.resolve()  # a bucket left empty by a discarded submission goes too

    def _name(self, path: str) -> str:
        return object_name(self.prefix, path)

    def _object_path(self, path: str) -> Path:
        check_gcs_uri(self.uri(path), kept_locally=True)
        return super()._object_path(self._name(path))


    def upload(self, source: Path, path: str) -> str:
        uri = super().upload(source, path)
        give_to_replicas(self.keep, self._object_path(path))
        return uri

    def copy(self, source: str, path: str, md5: str) -> str | None:
        uri = super().copy(source, path, md5)
        if uri:
            give_to_replicas(self.keep, self._object_path(path))
        return uri

    def uri(self, path: str) -> str:
        return f"{self.url}/{self._name(path)}".rstrip("/")

    def _missing(self, path: str) -> str:
        return (
            f"[{self.uri(path)}] does not exist on this machine, where gs:// paths are kept (AIPTRAIN_GCS=local): "
            f"put the file at {self.object_file(path)}, or set AIPTRAIN_GCS=remote to read it from Cloud Storage."
        )

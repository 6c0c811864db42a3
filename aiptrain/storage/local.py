"""A bucket that is a directory on this machine (the default, embedded setup)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from aiptrain.errors import ValidationError
from aiptrain.storage import bucket_name, check_gcs_uri, object_name


def feed_file(digest, path: Path):
    """Update a hashlib object with a file's bytes, a megabyte at a time; return it."""
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest


def md5_base64(path: Path) -> str:
    """A file's MD5 in the form Cloud Storage reports it (base64 of the digest)."""
    import base64
    import hashlib

    return base64.b64encode(feed_file(hashlib.md5(usedforsecurity=False), path).digest()).decode()


def link_or_copy(source: Path, target: Path) -> None:
    """A hard link when both are on one file system (no bytes copied), else a copy. Safe for
    staged files and objects: they are never modified in place."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


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
        """The file for an object path; an object path can never leave the bucket root."""
        candidate = (self.root / path.lstrip("/")).resolve()
        if candidate != self.root and not candidate.is_relative_to(self.root):
            raise ValidationError(f"Object path [{path}] escapes the bucket [{self.url}]; use a path inside it.")
        return candidate

    def uri(self, path: str) -> str:
        return f"file://{self._object_path(path)}"

    def _missing(self, path: str) -> str:
        return f"[{self.uri(path)}] does not exist: check the path."

    def exists(self, path: str) -> bool:
        return self._object_path(path).is_file()

    def upload(self, source: Path, path: str) -> str:
        target = self._object_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Write beside the target and rename, so a reader never sees half an object.
        partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
        shutil.copyfile(source, partial)
        os.replace(partial, target)
        return self.uri(path)

    def copy(self, source: str, path: str, md5: str) -> str | None:
        original = self._object_path(source)
        if not original.is_file() or md5_base64(original) != md5:
            return None
        target = self._object_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
        partial.unlink(missing_ok=True)
        link_or_copy(original, partial)
        os.replace(partial, target)
        return self.uri(path)

    def download(self, path: str, destination: Path) -> None:
        source = self._object_path(path)
        if not source.is_file():
            raise ValidationError(self._missing(path))
        destination.parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(source, destination)

    def delete_prefix(self, prefix: str) -> None:
        target = self._object_path(prefix)
        if target == self.root:
            raise ValidationError("Refusing to delete a whole bucket.")
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
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

    object_file = _object_path  # the file that holds the object at a path (which may not exist yet)

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

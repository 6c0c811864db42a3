"""A bucket that is a directory on this machine (the default, embedded setup)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from aiptrain.errors import ValidationError


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


class LocalBucket:
    def __init__(self, root: Path):
        self.root = root.resolve()
        self.url = f"file://{self.root}"

    def _object_path(self, path: str) -> Path:
        """The file for an object path; an object path can never leave the bucket root."""
        candidate = (self.root / path.lstrip("/")).resolve()
        if candidate != self.root and not candidate.is_relative_to(self.root):
            raise ValidationError(f"Object path [{path}] escapes the bucket [{self.url}]; use a path inside it.")
        return candidate

    def uri(self, path: str) -> str:
        return f"file://{self._object_path(path)}"

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
        # Drop parent directories the object left empty, up to the bucket root.
        for parent in target.parents:
            if parent == self.root or not parent.is_relative_to(self.root):
                break
            try:
                parent.rmdir()
            except OSError:
                break

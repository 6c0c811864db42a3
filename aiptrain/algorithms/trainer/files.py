"""Reading the data and writing the outputs, on Cloud Storage (gs://, through gcsfs: in a
replica here the installation's storage endpoint answers it) or on a local path. TensorFlow's
checkpoints and SavedModel are written by TensorFlow's own file system instead."""

from __future__ import annotations

import os

from .preprocess import DataError


def is_gcs(path: str) -> bool:
    return path.startswith("gs://")


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def _gcs():
    import gcsfs  # in the runtime image; only gs:// paths need it

    return gcsfs.GCSFileSystem()


def read_text(path: str, what: str) -> str:
    """The file's text (UTF-8); DataError naming `what` when it is missing or not text."""
    try:
        if is_gcs(path):
            data = _gcs().cat_file(path)
        else:
            with open(path, "rb") as source:
                data = source.read()
    except FileNotFoundError:
        raise DataError(f"--{what} [{path}] does not exist.") from None
    except IsADirectoryError:
        raise DataError(f"--{what} [{path}] is a directory: name a CSV file.") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"--{what} [{path}] is not UTF-8 text (byte {exc.start}): save the CSV as UTF-8.") from None


def write_text(path: str, text: str) -> None:
    if is_gcs(path):
        _gcs().pipe_file(path, text.encode())
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        out.write(text)


def write_bytes_from(local_file: str, path: str) -> None:
    """Copy a file written locally (an XGBoost model) to `path`."""
    with open(local_file, "rb") as source:
        data = source.read()
    if is_gcs(path):
        _gcs().pipe_file(path, data)
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as out:
        out.write(data)

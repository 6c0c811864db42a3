"""A Google Cloud Storage bucket (`gs://name`), through google-cloud-storage.

Credentials come from the environment as Google's libraries find them (Application
Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, gcloud's ADC file, the metadata
server). With STORAGE_EMULATOR_HOST set, the library talks to that emulator and we
use anonymous credentials, as emulators expect.

Every failure becomes one line naming the bucket and the fix (a ValidationError, so
submit exits 2 and leaves nothing behind). Transient errors are retried by the
library's own policy, but an endpoint that cannot be connected to at all (emulator
down, no network) is not retried: the user hears about it in seconds, not minutes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from aiptrain.errors import ValidationError, first_line
from aiptrain.safe_files import partial_name
from aiptrain.settings import gcloud_property
from aiptrain.storage.urls import bucket_name, emulator_host, object_name

# Files above this size are sent as resumable uploads, in chunks of this size
# (a multiple of 256 KiB, as the API requires); a failed chunk is resent, not the file.
CHUNK_SIZE = 8 << 20
TIMEOUT = (10, 120)  # seconds: (connect, read) for each HTTP request
RETRY_SECONDS = 60  # total time the library may spend retrying one call
EMULATOR_PROJECT = "test"


def endpoint() -> str:
    """Where requests go: the emulator, or Google's service."""
    return emulator_host() or "https://storage.googleapis.com"


class GcsBucket:
    def __init__(self, bucket_url: str, prefix: str = ""):
        self.name = bucket_name(bucket_url)
        self.prefix = prefix.strip("/")
        self.url = f"gs://{self.name}"
        self._handle = None

    # -- object paths ----------------------------------------------------------------------

    def _name(self, path: str) -> str:
        return object_name(self.prefix, path)

    def uri(self, path: str) -> str:
        return f"{self.url}/{self._name(path)}"

    # -- the client, created on first use --------------------------------------------------

    @property
    def _bucket(self):
        if self._handle is None:
            with self._translated():
                self._handle = _client().bucket(self.name)
        return self._handle

    # -- the Bucket protocol ---------------------------------------------------------------

    def exists(self, path: str) -> bool:
        with self._translated():
            return self._bucket.blob(self._name(path)).exists(timeout=TIMEOUT, retry=_retry())

    def upload(self, source: Path, path: str) -> str:
        from google.api_core.exceptions import PreconditionFailed

        blob = self._bucket.blob(self._name(path), chunk_size=CHUNK_SIZE)
        with self._translated():
            try:
                # Create-only: staged paths contain the content's digest, so an object already
                # there (a concurrent submit of the same files) has the same bytes.
                blob.upload_from_filename(str(source), if_generation_match=0, timeout=TIMEOUT, retry=_retry())
            except PreconditionFailed:
                pass
        return self.uri(path)

    def copy(self, source: str, path: str, md5: str) -> str | None:
        """Copy the object at `source` to `path` inside the bucket, without the bytes leaving
        Google's side, if `source` still holds content with this MD5 (base64, as GCS reports
        it). None when it does not: the caller uploads instead."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = self._bucket.blob(self._name(source))
        with self._translated():
            try:
                blob.reload(timeout=TIMEOUT, retry=_retry())
            except NotFound:
                return None
            if blob.md5_hash != md5:
                return None
            try:
                self._bucket.copy_blob(
                    blob, self._bucket, self._name(path),
                    if_source_generation_match=blob.generation, if_generation_match=0,
                    timeout=TIMEOUT, retry=_retry(),
                )
            except (NotFound, PreconditionFailed):
                # The source changed under us, or the target already exists.
                return self.uri(path) if self.exists(path) else None
        return self.uri(path)

    def download(self, path: str, destination: Path) -> None:
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = destination.with_name(partial_name(destination.name))
        with self._translated(missing_object=self.uri(path)):
            try:
                self._bucket.blob(self._name(path)).download_to_filename(
                    str(partial), timeout=TIMEOUT, retry=_retry()
                )
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
        os.replace(partial, destination)

    def delete_prefix(self, prefix: str) -> None:
        from google.api_core.exceptions import NotFound

        name = self._name(prefix)
        if not name:
            raise ValidationError("Refusing to delete a whole bucket.")
        with self._translated():
            blobs = list(self._bucket.client.list_blobs(self.name, prefix=name + "/", timeout=TIMEOUT, retry=_retry()))
            blobs.append(self._bucket.blob(name))  # the prefix may itself be an object
            for blob in blobs:
                try:
                    blob.delete(timeout=TIMEOUT, retry=_retry())
                except NotFound:
                    pass

    # -- errors ------------------------------------------------------------------------------

    @contextmanager
    def _translated(self, missing_object: str | None = None) -> Iterator[None]:
        """Turn the library's exceptions into one line naming the bucket and the fix.
        `missing_object`: the object read, when "not found" may mean it rather than the bucket."""
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth

        try:
            yield
        except ValidationError:
            raise
        except api.RetryError as exc:
            raise ValidationError(self._unreachable(exc.cause or exc)) from None
        except api.NotFound:
            if missing_object:
                message = f"[{missing_object}] does not exist: check the URL, and that bucket [{self.url}] exists."
            else:
                message = (
                    f"Bucket [{self.url}] does not exist: create it "
                    f"(`gcloud storage buckets create {self.url}`) or name another bucket."
                )
            raise ValidationError(message) from None
        except (api.Forbidden, api.Unauthorized) as exc:
            raise ValidationError(
                f"Permission denied on bucket [{self.url}] ({exc.code}: {first_line(exc.message)}): give the "
                "credentials in use access to its objects, or use other credentials (GOOGLE_APPLICATION_CREDENTIALS)."
            ) from None
        except auth.DefaultCredentialsError:
            raise ValidationError(
                f"No Google Cloud credentials for bucket [{self.url}]: run `gcloud auth application-default login`, "
                "set GOOGLE_APPLICATION_CREDENTIALS, set STORAGE_EMULATOR_HOST to use an emulator, or set "
                "AIPTRAIN_GCS=local to keep gs:// paths on this machine."
            ) from None
        except auth.RefreshError as exc:
            raise ValidationError(
                f"Cannot authenticate for bucket [{self.url}] ({first_line(str(exc))}): renew the credentials "
                "(`gcloud auth application-default login`)."
            ) from None
        except api.GoogleAPICallError as exc:
            raise ValidationError(
                f"Cloud Storage refused a request on bucket [{self.url}] ({exc.code}: {first_line(exc.message)}): "
                "check the bucket and try again."
            ) from None
        except _transport_errors() as exc:
            raise ValidationError(self._unreachable(exc)) from None

    def _unreachable(self, exc: BaseException) -> str:
        if emulator_host():
            fix = "start the emulator there, or unset STORAGE_EMULATOR_HOST to use Google's service"
        else:
            fix = "check the network connection and try again"
        return f"Cannot reach Cloud Storage at {endpoint()} for bucket [{self.url}] ({_reason(exc)}): {fix}."


# -- helpers --------------------------------------------------------------------------------


def _client():
    from google.cloud import storage

    if emulator_host():
        from google.auth.credentials import AnonymousCredentials

        project = os.environ.get("GOOGLE_CLOUD_PROJECT") or EMULATOR_PROJECT
        return storage.Client(project=project, credentials=AnonymousCredentials())
    # Object operations need no project; None keeps the library from insisting on one.
    return storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT"))


def _retry():
    """The library's retry policy, bounded in time, and never for an endpoint that cannot be
    connected to at all: retrying that only makes the user wait."""
    from google.cloud.storage.retry import DEFAULT_RETRY, _should_retry

    return (
        DEFAULT_RETRY.with_predicate(lambda exc: _should_retry(exc) and not _never_connected(exc))
        .with_delay(initial=0.5, maximum=8.0)
        .with_timeout(RETRY_SECONDS)
    )


def _causes(exc: BaseException | None, context: bool = False) -> Iterator[BaseException]:
    """`exc` and what it wraps, outermost first: urllib3 keeps the cause in `.reason` or the
    first argument, Python in `__cause__` (and `__context__` when asked for)."""
    for _ in range(8):
        if exc is None:
            return
        yield exc
        nested = getattr(exc, "reason", None)
        if not isinstance(nested, BaseException):
            nested = exc.args[0] if exc.args and isinstance(exc.args[0], BaseException) else None
        exc = nested or exc.__cause__ or (exc.__context__ if context else None)


def _never_connected(exc: BaseException | None) -> bool:
    """True when no connection was made (refused, DNS failure, connect timeout)."""
    import urllib3.exceptions

    lost = (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError)
    return any(isinstance(cause, lost) for cause in _causes(exc, context=True))


def _transport_errors() -> tuple[type[BaseException], ...]:
    """What a request that did not reach Cloud Storage raises."""
    import requests
    import urllib3.exceptions
    from google.auth import exceptions as auth

    return (ConnectionError, auth.TransportError, requests.RequestException, urllib3.exceptions.HTTPError)


def _reason(exc: BaseException) -> str:
    """The innermost cause of a transport failure, e.g. `[Errno 111] Connection refused`."""
    *_, innermost = _causes(exc)
    text = first_line(str(innermost))
    return text.rsplit("): ", 1)[-1].rsplit(": ", 1)[-1] if "Errno" in text else text


# -- what replicas need to reach the same storage ------------------------------------------------

CONTAINER_CREDENTIALS = "/opt/aiptrain/credentials/application_default_credentials.json"
_LOOPBACK_NAMES = {"localhost", "ip6-localhost", "::1", "0.0.0.0"}


def replica_access(host_gateway: str | None) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(environment, [(host file, container path)] to mount read-only) with which a replica's
    Google libraries reach the storage this host reaches: the emulator (at an address a
    container can reach), the project, and the credentials file that Application Default
    Credentials would use here. The credentials travel as a mounted file, never as a value."""
    env: dict[str, str] = {}
    emulator = emulator_host()
    if emulator:
        env["STORAGE_EMULATOR_HOST"] = reachable_from_containers(emulator, host_gateway)
    for name in ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT"):
        if os.environ.get(name):
            env[name] = os.environ[name]

    project = gcloud_property("core/project")  # its variable, or `gcloud config set project` through the shim
    if project:
        env["CLOUDSDK_CORE_PROJECT"] = project
    mounts = []
    credentials = credentials_file()
    if credentials is not None:
        env["GOOGLE_APPLICATION_CREDENTIALS"] = CONTAINER_CREDENTIALS
        mounts.append((str(credentials), CONTAINER_CREDENTIALS))
    return env, mounts


def credentials_file() -> Path | None:
    """The credentials file google-auth would load on this host, if it would load one."""
    explicit = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if explicit:
        path = Path(explicit).expanduser()
    else:
        config = os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud"
        path = Path(config) / "application_default_credentials.json"
    return path.resolve() if path.is_file() else None


def reachable_from_containers(address: str, host_gateway: str | None) -> str:
    """An emulator address as a container sees it. `localhost` inside a replica is the replica
    itself; the host is reached at its address on Docker's bridge (the emulator must listen
    there too: bind it to 0.0.0.0). Other addresses are left as they are."""
    has_scheme = "://" in address
    parts = urlsplit(address if has_scheme else f"//{address}")
    host = parts.hostname or ""
    if not host_gateway or not (host in _LOOPBACK_NAMES or host.startswith("127.")):
        return address
    netloc = f"{host_gateway}:{parts.port}" if parts.port else host_gateway
    rebuilt = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return rebuilt if has_scheme else rebuilt.lstrip("/")

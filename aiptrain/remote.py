"""Client mode: the `Client` façade (a JobService, aiptrain.service) over another installation's `aiptrain serve`, chosen when
AIPTRAIN_API (or gcloud's api_endpoint_overrides/ml property, through the shim) names one.

Every job verb goes through the ml v1 REST API with the real google-api-python-client and its
bundled discovery documents, so this is also what any other client of the service does:

- submit packages here (the same cached sdist as local mode), uploads it to the job's staging
  bucket through the server's Cloud Storage endpoint (on the same URL) and creates the job
  with `packageUris: ["gs://..."]`;
- get, list (gcloud's filter, answered by the server), cancel and patch (labels, with the etag)
  are the REST methods; logs are Cloud Logging's entries.list, polled as gcloud's stream-logs does.

The CLI prints what it gets the way it prints local jobs (aiptrain.cli.formats, aiptrain.logs).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property
from pathlib import Path
from urllib.parse import urlsplit

from aiptrain import filtering, logs, staging
from aiptrain.config import SubmitFlags
from aiptrain.errors import AiptrainError, EnvironmentNotReady, JobExists, JobNotFound, ValidationError
from aiptrain.exports import dry_run_tfjob, dry_run_trainjob
from aiptrain.model import Job, State
from aiptrain.packaging import cached_sdist
from aiptrain.replicas import ReplicaObservation
from aiptrain.service import LabelsUpdate
from aiptrain.settings import Settings
from aiptrain.storage import is_gcs
from aiptrain.storage.gcs import _retry
from aiptrain.submission import (
    LAUNCH_LOOK_SECONDS,
    QUICK_LAUNCH_LOOK_SECONDS,
    QUICK_LAUNCH_SECONDS,
    launch_failure,
    prepare,
)
from aiptrain.trainjob import Runtime
from aiptrain.validation import check_label_count, validate_labels

TIMEOUT_SECONDS = 60  # per HTTP request
LOG_PAGE_SIZE = 1000  # Cloud Logging's most per page
CANCEL_POLL_SECONDS = 0.5
BUILD_POLL_SECONDS, BUILD_WAIT_SECONDS = 5, 3600  # a runtime image the server builds for a create: ask again
PATCH_ATTEMPTS = 5  # labels changed by someone else between our get and patch: read again
# Where packages go without a gs:// --staging-bucket or --job-dir (AIPTRAIN_STAGING_BUCKET
# counts when it is gs://): a bucket of the server's, as local mode's default is a directory of its home.
DEFAULT_STAGING_BUCKET = "gs://aiptrain-staging"
TOKEN_HINT = ("set AIPTRAIN_API_TOKEN to a token the server's --tokens file names for this project (writable to "
              "change jobs).")


def api_endpoint(url: str) -> str:
    """AIPTRAIN_API as the base URL requests go to (`http://host:port`); ValidationError (exit 2)
    for anything that is not an http(s) URL of a host. A trailing `/` or `/v1/` (as gcloud's
    property is often written) is dropped."""
    text = url.strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValidationError(f"AIPTRAIN_API [{url}] is not an http:// or https:// URL of an `aiptrain serve`: "
                              "set it to one such as http://trainer-host:8080, or unset it to run jobs here.")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"


class ApiClient:
    """The jobs of the installation behind `aiptrain serve` at settings.api_url, in `project`
    (default: the settings' project, CLOUDSDK_CORE_PROJECT or `aiptrain`). Same methods as
    aiptrain.client.Client for what the CLI's job verbs use."""

    def __init__(self, settings: Settings | None = None, project: str | None = None):
        self.settings = settings or Settings()
        self.url = api_endpoint(self.settings.api_url)
        self.project = project or self.settings.default_project
        self._connections: list = []  # the httplib2.Http of each service: kept-alive connections

    def close(self) -> None:
        for connections in self._connections:
            connections.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the REST clients -------------------------------------------------------------------

    def _credentials(self):
        from google.auth.credentials import AnonymousCredentials
        from google.oauth2.credentials import Credentials

        # A bare token: google-auth sends it as `Authorization: Bearer`, and never refreshes it.
        return Credentials(self.settings.api_token) if self.settings.api_token else AnonymousCredentials()

    def _service(self, name: str, version: str):
        import google_auth_httplib2
        import httplib2
        from googleapiclient import discovery

        connections = httplib2.Http(timeout=TIMEOUT_SECONDS)
        self._connections.append(connections)
        # No refresh on 401: a bare token cannot be refreshed, and the server's answer says why.
        http = google_auth_httplib2.AuthorizedHttp(self._credentials(), http=connections, refresh_status_codes=())
        return discovery.build(name, version, static_discovery=True, http=http,
                               client_options={"api_endpoint": self.url})

    @cached_property
    def _jobs(self):
        return self._service("ml", "v1").projects().jobs()

    @cached_property
    def _entries(self):
        return self._service("logging", "v2").entries()

    def _name(self, job_id: str) -> str:
        return f"projects/{self.project}/jobs/{job_id}"

    def _call(self, request, job_id: str | None = None) -> dict:
        """Execute a googleapiclient request; its refusal as aiptrain's errors (so the CLI says one
        line with the usual exit status), a server that cannot be reached as EnvironmentNotReady."""
        from googleapiclient.errors import HttpError

        try:
            return request.execute(num_retries=0)
        except HttpError as error:
            raise self._translated(error, job_id) from None
        except (OSError, ConnectionError) as exc:  # refused, unreachable, timed out
            raise self._unreachable(exc) from None
        except Exception as exc:
            import httplib2

            if isinstance(exc, httplib2.HttpLib2Error):  # a host name that does not resolve, ...
                raise self._unreachable(exc) from None
            raise

    def _unreachable(self, exc: Exception) -> EnvironmentNotReady:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return EnvironmentNotReady(f"Cannot reach the aiptrain API at {self.url} (AIPTRAIN_API): {reason}; start "
                                   "`aiptrain serve` there, or fix AIPTRAIN_API.")

    def _translated(self, error, job_id: str | None) -> AiptrainError:
        code = error.resp.status
        try:
            body = json.loads(error.content)["error"]
            message, status = str(body.get("message") or ""), str(body.get("status") or "")
        except (ValueError, KeyError, TypeError, AttributeError):
            message, status = f"HTTP {code} from {self.url}", ""
        where = f" (aiptrain API at {self.url})"
        if code == 404 and job_id:
            return JobNotFound(job_id)
        if code == 409 and status == "ALREADY_EXISTS":
            return JobExists(message)
        if code in (401, 403):
            return ValidationError(f"{message.rstrip('.')}{where}: {TOKEN_HINT}")
        if code == 503:
            return EnvironmentNotReady(message + where)
        if 400 <= code < 500:
            return ValidationError(message + where)
        return AiptrainError(message + where)

    # -- submit ----------------------------------------------------------------------------

    def prepare(self, flags: SubmitFlags, base: Job | None = None):
        """The same checks as local mode, without side effects; gs:// paths and how many of a
        study's trials run at once are the server's business, so this machine is not asked."""
        flags.project = flags.project or self.project
        return prepare(flags, dataclasses.replace(self.settings, gcs_mode="remote"), base, self._job_or_none,
                       runs_here=False)

    def _job_or_none(self, job_id: str) -> Job | None:
        """A job of the project on the server (a resumed study's previous job), None if there is none."""
        try:
            return self.get(job_id)
        except JobNotFound:
            return None

    def submit(self, submission, report: Callable[[str], None] | None = None,
               build_progress: Callable[[str], None] | None = None) -> Job:
        """Package and upload here, create there. The server builds a missing runtime image
        itself (503 meanwhile: this waits and tries again, saying so once)."""
        report = report or (lambda line: None)
        project = submission.project or self.project
        job = submission.job
        ti = job.training_input
        files = list(submission.local_packages)
        if submission.package_path:
            report(f"Packaging {submission.package_path}")
            files.append(cached_sdist(submission.package_path, self.settings.cache_dir, (self.settings.home,)).path)
        if files or submission.remote_packages:  # packageUris of a --config count only without package flags
            ti.package_uris = [*submission.remote_packages, *self._upload(files, submission, report)]
        body = {key: value for key, value in job.to_resource().items() if key not in _OUTPUT_ONLY}
        if submission.runtime and submission.runtime_given_as == "AIPTRAIN_DEFAULT_RUNTIME":
            del body["trainingInput"]["runtimeVersion"]  # not asked for: the server's default applies
        request = self._jobs.create(parent=f"projects/{project}", body=body)
        said, deadline = False, time.monotonic() + BUILD_WAIT_SECONDS
        while True:
            try:
                created = self._call(request, None)
                break
            except EnvironmentNotReady as exc:
                if "is building it now" not in str(exc) or time.monotonic() > deadline:
                    raise
                if not said:
                    (build_progress or report)(str(exc).split(" (aiptrain API at")[0])
                    said = True
                time.sleep(BUILD_POLL_SECONDS)
        return self._launched(_job(created), project)

    def _launched(self, job: Job, project: str) -> Job:
        """As local mode's submit: once the controller has launched an admitted job (the server's
        create answers as queued, as the service did), and a launch the engine refused is this
        submit's error (exit 3)."""
        started = time.monotonic()
        while job.state is State.PREPARING:
            time.sleep(QUICK_LAUNCH_LOOK_SECONDS if time.monotonic() - started < QUICK_LAUNCH_SECONDS
                       else LAUNCH_LOOK_SECONDS)
            job = _job(self._call(self._jobs.get(name=f"projects/{project}/jobs/{job.job_id}"), job.job_id))
        if job.state is State.FAILED and job.error_message:
            raise EnvironmentNotReady(launch_failure(job.error_message))
        return job

    def _upload(self, files: list[Path], submission, report: Callable[[str], None]) -> list[str]:
        """Put `files` where local mode would stage them (`<prefix>/<sha256>/<name>` of the
        staging bucket, else the gs:// job dir's `packages/`, else DEFAULT_STAGING_BUCKET's
        `<job>/`), through the server's Cloud Storage endpoint; an object already there with that
        content is not sent again."""
        if not files:
            return []

        ti = submission.job.training_input
        gcs_job_dir = ti.job_dir if ti.job_dir and is_gcs(ti.job_dir) else None
        staging_bucket = submission.staging_bucket if submission.staging_bucket and is_gcs(
            submission.staging_bucket) else None
        bucket_url, prefix = staging.staging_target(submission.job.job_id, staging_bucket, gcs_job_dir,
                                                    DEFAULT_STAGING_BUCKET)
        bucket = self._bucket(bucket_url.removeprefix("gs://").split("/")[0])
        digest_prefix = f"{prefix}/{staging.combined_sha256(files)}"
        report(f"Uploading {len(files)} file(s) to gs://{bucket.name}/{digest_prefix}")
        uris = []
        for path in files:
            name = f"{digest_prefix}/{path.name}"
            blob = bucket.blob(name)
            if not self._storage_call(blob.exists):
                self._storage_call(blob.upload_from_filename, str(path))
            uris.append(f"gs://{bucket.name}/{name}")
        return uris

    def _bucket(self, name: str):
        from google.cloud import storage

        client = storage.Client(project=self.project, credentials=self._credentials(),
                                client_options={"api_endpoint": self.url})
        bucket = client.bucket(name)
        if not self._storage_call(bucket.exists):
            self._storage_call(bucket.create)  # as local mode makes a bucket directory
        return bucket

    def _storage_call(self, method, *args):
        from google.api_core import exceptions
        from google.auth.exceptions import GoogleAuthError

        try:
            return method(*args, timeout=TIMEOUT_SECONDS, retry=_retry())
        except exceptions.GoogleAPICallError as exc:
            code = exc.code or 0
            error = ValidationError if 400 <= code < 500 else AiptrainError
            hint = f"; {TOKEN_HINT}" if code in (401, 403) else ""
            raise error(f"Cloud Storage at {self.url} refused the upload ({code}): {exc.message}{hint}") from None
        except GoogleAuthError:  # a 401, which google-auth tried to answer by refreshing the token
            raise ValidationError(f"Cloud Storage at {self.url} refused the upload (401): the server wants a token; "
                                  f"{TOKEN_HINT}") from None
        except (OSError, ConnectionError) as exc:
            raise self._unreachable(exc) from None

    # -- read ------------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        return _job(self._call(self._jobs.get(name=self._name(job_id)), job_id))

    def list_resources(self, filter: str | None = None, sort_by: str | Iterable[str] | None = None,
                       limit: int | None = None, fields: Iterable[str] | None = None) -> list[dict]:
        """The jobs `jobs list` selects: the server filters (gcloud's syntax), every page is read,
        and --sort-by and --limit apply here, as local mode applies them."""
        found, token = [], None
        while True:
            page = self._call(self._jobs.list(parent=f"projects/{self.project}", filter=filter or None,
                                              pageSize=100, pageToken=token))
            found += [_resource(item) for item in page.get("jobs", [])]
            token = page.get("nextPageToken")
            if not token:
                break
        keys = filtering.parse_sort_keys(sort_by)
        return filtering.select(found, None, keys, limit, lambda resource: resource)

    def job_ids(self, prefix: str = "") -> list[str]:
        return [r["jobId"] for r in self.list_resources() if r.get("jobId", "").startswith(prefix)]

    def waiting_reason(self, job_id: str) -> str | None:
        return None  # the server's reason is in the job's log (stream-logs shows it)

    def uri(self, job_id: str, project: str | None = None) -> str:
        return f"{self.url}/v1/projects/{project or self.project}/jobs/{job_id}"

    @property
    def local_gcs_root(self) -> None:
        return None  # gs:// paths live on the server

    # -- wait, logs, cancel ----------------------------------------------------------------

    def wait(self, job_id: str, timeout: float | None = None, poll_seconds: float = 1.0) -> Job:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if _ended(job) or (deadline is not None and time.monotonic() >= deadline):
                return job
            time.sleep(poll_seconds)

    def log_blocks(self, job_id: str, poll_seconds: float = 0.2) -> Iterator[bytes]:
        """The job's log as local mode reads it (blocks of JSON lines for logs.format_lines),
        from entries.list: everything, then what is newer, until the job has ended."""
        return self._follow(job_id, poll_seconds)

    def log_batches(self, job_id: str, task_name: str | None = None, poll_seconds: float = 0.2,
                    on_poll: Callable[[Job], None] | None = None) -> Iterator[list[logs.LogRecord]]:
        for block in self._follow(job_id, poll_seconds, on_poll):
            batch = logs.records_of(block, task_name)
            if batch:
                yield batch

    def _follow(self, job_id: str, poll_seconds: float,
                on_poll: Callable[[Job], None] | None = None) -> Iterator[bytes]:
        """Rounds of entries.list for the lines written since the last round, in the order they
        were written (insertId is the line's offset in the job's log: a later line has a
        greater one, whatever its timestamp, so none is skipped as a timestamp cursor would).
        The job's state is read before each round, so the round after it ended reads its last
        lines; `on_poll` sees the job each time."""
        self.get(job_id)  # JobNotFound before anything else
        interval = max(poll_seconds, 0.5)
        after = ""  # the greatest insertId read
        while True:
            job = self.get(job_id)
            if on_poll:
                on_poll(job)
            entries = sorted((e for page in self._entry_pages(job_id, after) for e in page),
                             key=lambda entry: entry["insertId"])
            if entries:
                yield "".join(_record_line(entry) for entry in entries).encode()
                after = entries[-1]["insertId"]
            if _ended(job):
                return
            time.sleep(interval)

    def _entry_pages(self, job_id: str, after: str) -> Iterator[list[dict]]:
        """Pages of the job's entries whose insertId is greater than `after`."""
        conditions = ['resource.type="ml_job"', f'resource.labels.job_id="{job_id}"']
        if after:
            conditions.append(f'insertId>"{after}"')
        token = None
        while True:
            body = {"resourceNames": [f"projects/{self.project}"], "filter": " AND ".join(conditions),
                    "orderBy": "timestamp asc", "pageSize": LOG_PAGE_SIZE}
            if token:
                body["pageToken"] = token
            page = self._call(self._entries.list(body=body), job_id)
            if page.get("entries"):
                yield page["entries"]
            token = page.get("nextPageToken")
            if not token:
                return

    def replicas(self, job_id: str) -> list[ReplicaObservation]:
        return []  # the server's engine is not reachable from here

    def restart_counts(self, job_id: str) -> dict[str, int]:
        return {}

    def cancel(self, job_id: str, timeout: float = 60) -> Job:
        """Cancel and wait (up to `timeout`) until the job has stopped; one that ended stays as it is."""
        try:
            self._call(self._jobs.cancel(name=self._name(job_id), body={}), job_id)
        except ValidationError as exc:
            if "has already ended" not in str(exc):
                raise
        return self.wait(job_id, timeout, CANCEL_POLL_SECONDS)

    # -- labels ----------------------------------------------------------------------------

    def update_labels(self, job_id: str, update: dict[str, str] | None = None,
                      remove: Iterable[str] = (), clear: bool = False) -> LabelsUpdate:
        """`jobs update` as a patch of the labels with the etag read: if someone changed them
        meanwhile (409 ABORTED), read again and redo the change."""
        if update:
            validate_labels(update)
        remove = list(remove)
        for _ in range(PATCH_ATTEMPTS):
            current = self._call(self._jobs.get(name=self._name(job_id)), job_id)
            labels = dict(current.get("labels") or {})
            new = {} if clear else dict(labels)
            new.update(update or {})
            for key in remove:
                new.pop(key, None)
            check_label_count(new)
            if new == labels:
                return LabelsUpdate(_job(current), False)
            request = self._jobs.patch(name=self._name(job_id), updateMask="labels,etag",
                                       body={"labels": new, "etag": current.get("etag")})
            try:
                return LabelsUpdate(_job(self._call(request, job_id)), True)
            except ValidationError as exc:
                if "does not match" not in str(exc):
                    raise
        raise ValidationError(f"The labels of job [{job_id}] kept changing while they were updated: try again.")

    # -- list: after every method annotated with the builtin `list`, which it shadows -------

    def list(self, filter: str | None = None, sort_by: str | Iterable[str] | None = None,
             limit: int | None = None) -> list[Job]:
        return [Job.model_validate(resource) for resource in self.list_resources(filter, sort_by, limit)]

    # -- not served over the API -----------------------------------------------------------

    def dry_run_tfjob(self, submission):
        return dry_run_tfjob(submission, self.settings)

    def dry_run_trainjob(self, submission, runtime=None):
        return dry_run_trainjob(submission, self.settings, runtime or Runtime.AUTO)

    def export_trainjob(self, job_id: str, runtime=None):
        return self.export_tfjob(job_id)

    def export_tfjob(self, job_id: str):
        raise ValidationError("`jobs export` reads the job's staged packages on the machine that runs it: run it "
                              "there (unset AIPTRAIN_API here).")


_OUTPUT_ONLY = ("trainingOutput", "createTime", "startTime", "endTime", "state", "errorMessage", "etag",
                "jobPosition")


def _resource(item: dict) -> dict:
    """A Job resource as `describe` prints it: the REST answer without its etag."""
    return {key: value for key, value in item.items() if key != "etag"}


def _job(item: dict) -> Job:
    return Job.model_validate(_resource(item))


def _ended(job: Job) -> bool:
    return job.state is not None and job.state.is_terminal


def _record_line(entry: dict) -> str:
    """A Cloud Logging entry as the job-log line it was made from (aiptrain.logs.record_line)."""
    labels = entry.get("labels") or {}
    task = (entry.get("resource", {}).get("labels", {}).get("task_name")
            or labels.get("ml.googleapis.com/task_name", ""))
    message = (entry.get("jsonPayload") or {}).get("message", entry.get("textPayload", ""))
    return logs.record_line(entry.get("timestamp", ""), task, entry.get("severity", "DEFAULT"), str(message),
                            labels.get("ml.googleapis.com/trial_id", ""))

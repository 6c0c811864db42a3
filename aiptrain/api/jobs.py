"""ml v1 `projects.jobs` over aiptrain.client.Client: the same jobs, the same store, the same
rules as the CLI. A create is `jobs submit training JOB --config BODY --project P`; job IDs are
unique per project (aiptrain.jobkeys), and each request sees only its project's jobs: another
project's job of the same ID is neither found nor in the way of a create.

The Job resource is what `jobs describe --format json` prints, plus `etag`: a digest of the job's
ID and labels, so a patch with a stale etag is refused while state changes do not disturb it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import ValidationError as PydanticError

from aiptrain import listing, runtimes
from aiptrain.algorithms import images as algorithm_images
from aiptrain.algorithms.catalog import Algorithm
from aiptrain.api import tensorboards
from aiptrain.api.builds import RuntimeBuilds
from aiptrain.api.calls import ApiError, Call
from aiptrain.api.stores import ThreadStores
from aiptrain.api.tensorboards import TensorBoards
from aiptrain.client import Client
from aiptrain.config import SubmitFlags, pydantic_error_line
from aiptrain.errors import JobNotFound
from aiptrain.model import Job
from aiptrain.runtimes import check_available
from aiptrain.settings import Settings
from aiptrain.storage import gcs_root_for, is_gcs
from aiptrain.store import duplicate_job
from aiptrain.validation import validate_labels

log = logging.getLogger("aiptrain.api")
LIST_PAGE_SIZE, LIST_MOST = 20, 100  # the discovery document's default and maximum
OUTPUT_ONLY = ("trainingOutput", "createTime", "startTime", "endTime", "state", "errorMessage", "etag",
               "jobPosition")


def etag_of(job_id: str, labels: dict[str, str] | None) -> str:
    text = json.dumps([job_id, labels or {}], sort_keys=True)
    return base64.b64encode(hashlib.sha256(text.encode()).digest()[:8]).decode()


def resource(job: Job) -> dict:
    return {**job.to_resource(), "etag": etag_of(job.job_id, job.labels)}


class StaleEtag(Exception):
    pass


class JobMethods:
    def __init__(self, settings: Settings, stores: ThreadStores | None = None):
        self.settings = settings
        self.stores = stores or ThreadStores(settings)
        self._builds = RuntimeBuilds(self._build_runtime)
        self._algorithm_builds = RuntimeBuilds(self._build_algorithm, algorithm_images.image_is_current,
                                               "built-in algorithm image")
        self._tensorboards: TensorBoards | None = None  # made at the first request

    def _build_runtime(self, runtime) -> None:
        runtimes.ensure_image(runtime, self.settings.cache_dir, log.info, "runtimeVersion")

    def _build_algorithm(self, algorithm: Algorithm) -> None:
        algorithm_images.ensure_image(algorithm, self.settings.cache_dir, log.info)

    @contextmanager
    def _client(self, project: str) -> Iterator[Client]:
        """The façade over `project`'s jobs: it finds no other project's (JobNotFound: 404, as
        if absent)."""

        with Client(settings=self.settings, project=project, store=self.stores.get()) as client:
            yield client

    # -- methods ---------------------------------------------------------------------------

    def create(self, call: Call, project: str) -> dict:
        call.accept()
        call.authorize(project, write=True)
        job = _job_body(call.json_body())
        if not job.job_id:
            raise ApiError(400, "Field jobId is required: name the job in the request body.")
        self.check_host_paths(call, job)

        with self._client(project) as client:
            if client.store.key_of(project, job.job_id) is not None:
                raise duplicate_job(job.job_id)
            submission = client.prepare(SubmitFlags(job_id=job.job_id, project=project), base=job)
            submission = dataclasses.replace(submission, shared_buckets=call.access.shared_with(project))
            self.check_runtime_image(submission)
            return resource(client.queue(submission))

    def check_runtime_image(self, submission) -> None:
        """503 while the runtime's (or the built-in algorithm's) image is missing: it is built in
        the background, not in this request."""
        if submission.algorithm is not None and self.settings.auto_build:
            waiting = self._algorithm_builds.ready(submission.algorithm)
            if waiting:
                raise ApiError(503, waiting)
        if not (submission.runtime and self.settings.auto_build):
            return  # without auto-build, submit itself refuses a missing image (exit 3: 503)

        check_available(submission.runtime, submission.runtime_given_as)  # one that cannot be built: 503 now
        waiting = self._builds.ready(submission.runtime)
        if waiting:
            raise ApiError(503, waiting)

    def check_host_paths(self, call: Call, job: Job) -> None:
        """Paths on this machine (packageUris to read, a jobDir to mount read-write) are taken
        only from a server without tokens: a remote caller must not pick the server's files."""
        if call.access.open:
            return
        ti = job.training_input
        local = [uri for uri in ti.package_uris or [] if not is_gcs(uri)]
        if local:
            raise ApiError(400, f"packageUris [{local[0]}] is not a gs:// URI: a server with --tokens takes "
                           "packages from Cloud Storage only; upload the package and pass its gs:// URI.")
        if ti.job_dir and not is_gcs(ti.job_dir):
            raise ApiError(400, f"jobDir [{ti.job_dir}] is not a gs:// URI: a server with --tokens writes job "
                           "output to Cloud Storage only; pass gs://BUCKET/PATH.")

    def get(self, call: Call, project: str, job_id: str) -> dict:
        call.accept()
        call.authorize(project, write=False)
        with self._client(project) as client:
            return resource(client.get(job_id))

    def list(self, call: Call, project: str) -> dict:
        call.accept("filter", "pageSize", "pageToken")
        call.authorize(project, write=False)
        page_size = call.int_param("pageSize", LIST_PAGE_SIZE, LIST_MOST)
        after = _decode_token(call.params.get("pageToken") or "")

        with self._client(project) as client:
            # One more than the page: whether a next page exists. The store's default order is the
            # list's (newest first, then by ID), and the token's place is a condition in its SQL.
            found = listing.list_resources(self.settings, call.params.get("filter") or None, limit=page_size + 1,
                                           table=client.store, project=project, after=after)
            page: list[dict] = []
            more = False
            for item in found:
                if len(page) == page_size:
                    more = True
                    break
                page.append(item)
        answer: dict = {}
        if page:
            answer["jobs"] = [{**item, "etag": etag_of(item["jobId"], item.get("labels"))} for item in page]
        if more:
            answer["nextPageToken"] = _encode_token(page[-1])
        return answer

    def patch(self, call: Call, project: str, job_id: str) -> dict:
        call.accept("updateMask")
        call.authorize(project, write=True)
        mask = {name.strip() for name in call.params.get("updateMask", "").split(",") if name.strip()}
        if "labels" not in mask or mask - {"labels", "etag"}:
            raise ApiError(400, f"updateMask [{call.params.get('updateMask', '')}] is not served: only `labels` "
                           "(with `etag`) can be updated.")
        body = _job_body(call.json_body(), strip_output=False)
        labels = dict(body.labels or {})

        validate_labels(labels)
        with self._client(project) as client:
            key = client.key(job_id)

            def change(current: dict[str, str]) -> dict[str, str]:
                if body.etag and body.etag != etag_of(job_id, current):
                    raise StaleEtag()
                return labels

            try:
                job, _ = client.store.update_labels(key, change)
            except StaleEtag:
                raise ApiError(409, f"The etag of job [{job_id}] does not match: its labels changed since it was "
                               "read; get it again and retry.", "ABORTED") from None
            if job is None:  # deleted since the check above

                raise JobNotFound(job_id)
            return resource(job)

    def cancel(self, call: Call, project: str, job_id: str) -> dict:
        call.accept()
        call.authorize(project, write=True)
        call.json_body()  # `{}`; anything but a JSON object is refused
        with self._client(project) as client:
            job = client.get(job_id)
            if job.state is not None and job.state.is_terminal:
                raise ApiError(400, f"Job [{job_id}] has already ended ({job.state.value}): only QUEUED, PREPARING "
                               "and RUNNING jobs can be cancelled.", "FAILED_PRECONDITION")
            client.cancel(job_id, timeout=0)  # the service answers at once; the job ends CANCELLED soon
        return {}

    def tensorboard(self, call: Call, project: str, job_id: str) -> dict:
        """aiptrain's own method: TensorBoard on the job's output, for the console's button."""
        call.accept()
        call.authorize(project, write=False)
        call.json_body()
        if not call.access.open:
            raise ApiError(400, "TensorBoard is started only by a server on loopback without --tokens (it has no "
                           "authentication of its own): run `tensorboard --logdir JOB_DIR` where you need it.",
                           "FAILED_PRECONDITION")
        with self._client(project) as client:
            job = client.get(job_id)
            key = client.key(job_id)
        logdir = tensorboards.logdir_of(job.training_input.job_dir,
                                        gcs_root_for(self.settings.gcs_mode, self.settings.gcs_root)[0])
        if self._tensorboards is None:
            self._tensorboards = tensorboards.TensorBoards()
        port = self._tensorboards.open(key, logdir)
        return {"url": f"http://127.0.0.1:{port}/", "logdir": str(logdir)}

    def close(self) -> None:
        if self._tensorboards is not None:
            self._tensorboards.close()

    def get_iam_policy(self, call: Call, project: str, job_id: str) -> dict:
        call.accept("options.requestedPolicyVersion")
        call.authorize(project, write=False)
        with self._client(project) as client:
            client.get(job_id)
        return call.access.policy(project)

    def set_iam_policy(self, call: Call, project: str, job_id: str) -> dict:
        call.accept()
        call.authorize(project, write=True)
        policy = call.json_body().get("policy")
        with self._client(project) as client:
            client.get(job_id)
        current = call.access.policy(project)
        if not isinstance(policy, dict) or policy.get("bindings", []) != current.get("bindings", []):
            raise ApiError(400, "IAM policies here come from the server's --tokens file (one policy per project): "
                           "edit that file and restart `aiptrain serve`.", "FAILED_PRECONDITION")
        return current

    def test_iam_permissions(self, call: Call, project: str, job_id: str) -> dict:
        call.accept()
        asked = call.json_body().get("permissions", [])
        if not isinstance(asked, list) or not all(isinstance(p, str) for p in asked):
            raise ApiError(400, "permissions must be a list of permission names such as ml.jobs.get.")
        held = call.access.permissions(call.grant, project, asked)
        return {"permissions": held} if held else {}


def _job_body(body: dict, strip_output: bool = True) -> Job:
    """The body as a Job; ApiError(400) naming the first problem (unknown fields included).
    Output-only fields are ignored on create, as the service ignores them."""
    if strip_output:
        body = {key: value for key, value in body.items() if key not in OUTPUT_ONLY}
    try:
        return Job.model_validate(body)
    except PydanticError as exc:
        raise ApiError(400, pydantic_error_line(exc, "Invalid Job in the request body")) from None


def _encode_token(item: dict) -> str:
    text = json.dumps([item.get("createTime", ""), item.get("jobId", "")])
    return base64.urlsafe_b64encode(text.encode()).decode()


def _decode_token(token: str) -> tuple | None:
    if not token:
        return None
    try:
        create_time, job_id = json.loads(base64.urlsafe_b64decode(token.encode()))
        if not (isinstance(create_time, str) and isinstance(job_id, str)):
            raise ValueError
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise ApiError(400, "Invalid pageToken: pass the nextPageToken of the previous page unchanged.") from None
    return create_time, job_id

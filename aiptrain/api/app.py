"""The REST API without a transport: `App.handle(Request) -> Response`. Routing, the JSON body,
who the caller is, and Google's error body live here; server.py only moves bytes, so a
long-lived controller can host the same App behind its own listener.

Errors are Google's: `{"error": {"code": 404, "message": "...", "status": "NOT_FOUND"}}`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote

from aiptrain.api.access import Access, Grant, Refused
from aiptrain.errors import (
    AiptrainError,
    EnvironmentLacks,
    EnvironmentNotReady,
    JobExists,
    JobNotFound,
    ValidationError,
)
from aiptrain.settings import Settings

log = logging.getLogger("aiptrain.api")

MAX_BODY_BYTES = 1 << 20
STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
          409: "ALREADY_EXISTS", 413: "INVALID_ARGUMENT", 500: "INTERNAL", 503: "UNAVAILABLE"}
# Query parameters every Google API takes (system parameters); the rest are the method's own.
SYSTEM_PARAMETERS = frozenset({"alt", "prettyPrint", "fields", "key", "quotaUser", "$.xgafv", "callback",
                               "access_token", "upload_protocol", "uploadType", "oauth_token"})
_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}")


class ApiError(Exception):
    """A request answered with Google's error body."""

    def __init__(self, code: int, message: str, status: str | None = None):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status or STATUS[code]


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # as sent: percent-encoded, without the query
    query: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes = b""
    client: str = ""  # the peer's address, for the log


JSON_TYPE = "application/json; charset=UTF-8"


@dataclass(frozen=True)
class Response:
    code: int
    body: dict
    data: bytes | None = None  # a console file's bytes, sent as they are instead of `body`
    content_type: str = JSON_TYPE
    headers: dict[str, str] = field(default_factory=dict)

    def encoded(self) -> bytes:
        return self.data if self.data is not None else json.dumps(self.body, indent=2).encode() + b"\n"


@dataclass
class Call:
    """One request, parsed: what a method handler sees."""

    request: Request
    grant: Grant
    access: Access
    params: dict[str, str]

    def json_body(self) -> dict:
        """The body as a JSON object; ApiError(400) when it is not one."""
        if not self.request.body.strip():
            return {}
        try:
            value = json.loads(self.request.body)
        except (UnicodeDecodeError, ValueError) as exc:
            raise ApiError(400, f"Invalid JSON payload received: {exc}.") from None
        except RecursionError:
            raise ApiError(400, "Invalid JSON payload received: it nests too deeply.") from None
        if not isinstance(value, dict):
            raise ApiError(400, "Invalid JSON payload received: the body must be a JSON object.")
        return value

    def accept(self, *names: str) -> None:
        """ApiError(400) for a query parameter that is neither a system one nor one of `names`."""
        unknown = sorted(set(self.params) - SYSTEM_PARAMETERS - set(names))
        if unknown:
            raise ApiError(400, f"Invalid JSON payload received. Unknown name \"{unknown[0]}\": Cannot bind query "
                           "parameter.")

    def authorize(self, project: str, write: bool) -> None:
        self.access.check(self.grant, project, write)

    def int_param(self, name: str, default: int, most: int) -> int:
        text = self.params.get(name)
        if text is None or text == "":
            return default
        if not re.fullmatch(r"-?\d{1,10}", text):
            raise ApiError(400, f"Invalid value at '{name}' (TYPE_INT32), \"{text}\".")
        value = int(text)
        if value < 0:
            raise ApiError(400, f"{name} must not be negative.")
        return min(value, most) if value else default


Handler = Callable[..., dict]


class App:
    """The API of one installation (its settings: AIPTRAIN_HOME), answering as `access` allows."""

    def __init__(self, settings: Settings | None = None, access: Access | None = None):
        from aiptrain.api import entries, jobs

        self.settings = settings or Settings()
        self.access = access or Access()
        self._jobs = jobs.JobMethods(self.settings)
        self._entries = entries.EntryMethods(self.settings)

    def handle(self, request: Request) -> Response:
        grant = None
        try:
            if len(request.body) > MAX_BODY_BYTES:
                raise ApiError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.")
            params = _query(request.query)
            if request.method in ("GET", "HEAD") and is_console_path(request.path):
                return self._console(request.path)
            handler, args = self._route(request.method, _segments(request.path))
            grant = self.access.caller(request.headers.get("authorization"))
            answer = handler(Call(request, grant, self.access, params), *args)
            return Response(200, answer)
        except Refused as refused:
            log.warning("refused %s %s %s from %s (%s): %s", refused.code, request.method, request.path,
                        request.client, grant.name if grant else "no valid token", refused)
            return error_response(refused.code, str(refused))
        except ApiError as error:
            return error_response(error.code, error.message, error.status)
        except JobExists as exc:
            return error_response(409, str(exc))
        except JobNotFound as exc:
            return error_response(404, str(exc))
        except ValidationError as exc:
            return error_response(400, str(exc))
        except EnvironmentLacks as exc:
            return error_response(400, str(exc), "FAILED_PRECONDITION")
        except EnvironmentNotReady as exc:
            return error_response(503, str(exc))
        except AiptrainError as exc:
            log.error("%s %s failed: %s", request.method, request.path, exc)
            return error_response(500, str(exc))
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            return error_response(500, "Internal error: see the server's log.")

    def close(self) -> None:
        """Stop what requests started and outlive them (the console's TensorBoards)."""
        self._jobs.close()

    def _console(self, path: str) -> Response:
        """A file of the browser console: no data of any job, so no token (the console sends the
        caller's token with each API request it makes)."""
        from aiptrain import console

        found = console.asset(path, self.settings.default_project)
        if found is None:
            raise ApiError(404, f"Not found: the console has no file [{path}].")
        data, content_type = found
        return Response(200, {}, data=data, content_type=content_type, headers=console.HEADERS)

    def _route(self, method: str, segments: list[str]) -> tuple[Handler, tuple]:
        """The handler of (method, path) and its path arguments; ApiError(404/400) otherwise."""
        jobs, entries = self._jobs, self._entries
        match segments:
            case ["v1", "projects", project, "jobs"]:
                return _pick(method, {"GET": jobs.list, "POST": jobs.create}), (_project(project),)
            case ["v1", "projects", project, "jobs", last]:
                job_id, _, verb = last.partition(":")
                table = {
                    "": {"GET": jobs.get, "PATCH": jobs.patch},
                    "cancel": {"POST": jobs.cancel},
                    "getIamPolicy": {"GET": jobs.get_iam_policy, "POST": jobs.get_iam_policy},
                    "setIamPolicy": {"POST": jobs.set_iam_policy},
                    "testIamPermissions": {"POST": jobs.test_iam_permissions},
                    "tensorboard": {"POST": jobs.tensorboard},  # aiptrain's own, for the console
                }
                if verb not in table:
                    raise ApiError(404, f"Method [{verb}] not found on jobs.")
                return _pick(method, table[verb]), (_project(project), _job_id(job_id))
            case ["v2", "entries:list"]:
                return _pick(method, {"POST": entries.list}), ()
            case ["v1", "projects", _, "models" | "operations", *_]:  # 404: clients retry a 5xx
                raise ApiError(404, "Models and versions (prediction) are not served by aiptrain: it runs AI "
                               "Platform Training jobs (projects.jobs) only.")
        raise ApiError(404, "Not found: this server answers ml v1 projects.jobs and logging v2 entries:list.")


def is_console_path(path: str) -> bool:
    return path == "/" or path.startswith("/console/")


def _pick(method: str, handlers: dict[str, Handler]) -> Handler:
    if method not in handlers:
        raise ApiError(404, f"Method {method} is not served here: use {' or '.join(handlers)}.")
    return handlers[method]


def _segments(path: str) -> list[str]:
    """The path's segments, decoded; ApiError(400) for a name that could step out of its place
    (`..`, `.`, empty, an encoded slash or backslash, control characters)."""
    if not path.startswith("/"):
        raise ApiError(400, "The request path must start with /.")
    try:
        segments = [unquote(part, errors="strict") if "%" in part else part for part in path[1:].split("/")]
    except UnicodeDecodeError:
        raise ApiError(400, f"Invalid resource name in path [{path}]: it is not UTF-8.") from None
    for segment in segments:
        if segment in ("", ".", "..") or any(c in segment for c in "/\\") or not segment.isprintable():
            raise ApiError(400, f"Invalid resource name in path [{path}]: names are projects/PROJECT/jobs/JOB.")
    return segments


def _project(project: str) -> str:
    if not _PROJECT.fullmatch(project):
        raise ApiError(400, f"Invalid project [{project}]: use letters, digits, '-', '.', ':' and '_'.")
    return project


def _job_id(job_id: str) -> str:
    from aiptrain.validation import JOB_ID_PATTERN

    if not JOB_ID_PATTERN.fullmatch(job_id):
        raise ApiError(400, f"Invalid job name [{job_id}]: a job ID starts with a letter and holds letters, "
                       "digits and underscores (at most 128).")
    return job_id


def _query(query: str) -> dict[str, str]:
    try:
        pairs = parse_qs(query, keep_blank_values=True, strict_parsing=False, errors="strict", max_num_fields=50)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, f"Invalid query string: {exc}.") from None
    repeated = sorted(name for name, values in pairs.items() if len(values) > 1)
    if repeated:
        raise ApiError(400, f"Query parameter [{repeated[0]}] is given more than once.")
    params = {name: values[0] for name, values in pairs.items()}
    if params.get("alt", "json") != "json":
        raise ApiError(400, f"alt=[{params['alt']}] is not served: use alt=json.")
    return params


def error_response(code: int, message: str, status: str | None = None) -> Response:
    """Google's error body; a code without a canonical status of its own takes its class's."""
    status = status or STATUS.get(code) or ("UNIMPLEMENTED" if code == 501 else
                                            "INVALID_ARGUMENT" if code < 500 else "INTERNAL")
    return Response(code, {"error": {"code": code, "message": message, "status": status}})

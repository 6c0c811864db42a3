"""The REST API without a transport: `App.handle(Request) -> Response`. Routing, the JSON body,
who the caller is, and Google's error body live here; server.py only moves bytes, so a
long-lived controller can host the same App behind its own listener.

Errors are Google's: `{"error": {"code": 404, "message": "...", "status": "NOT_FOUND"}}`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from urllib.parse import parse_qs, unquote

from aiptrain import console
from aiptrain.api import entries, jobs, vertex
from aiptrain.api.access import Access, Refused
from aiptrain.api.calls import MAX_BODY_BYTES, ApiError, Call, Request, Response, error_response
from aiptrain.errors import (
    AiptrainError,
    EnvironmentLacks,
    EnvironmentNotReady,
    JobExists,
    JobNotFound,
    ValidationError,
)
from aiptrain.settings import Settings
from aiptrain.validation import JOB_ID_PATTERN

log = logging.getLogger("aiptrain.api")

_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}")
_LOCATION = re.compile(r"[a-z][a-z0-9-]{0,62}|-")
_NAMED_ID = re.compile(r"[a-z0-9_][a-z0-9_-]{0,62}(@[A-Za-z0-9][A-Za-z0-9-]{0,127})?")
Handler = Callable[..., dict]


class App:
    """The API of one installation (its settings: AIPTRAIN_HOME), answering as `access` allows."""

    def __init__(self, settings: Settings | None = None, access: Access | None = None):
        self.settings = settings or Settings()
        self.access = access or Access()
        self._jobs = jobs.JobMethods(self.settings)
        self._vertex = vertex.VertexMethods(self.settings, self._jobs)
        self._entries = entries.EntryMethods(self.settings, (entries.ml_job, vertex.log_source))

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
            return Response(200, answer, pretty=params.get("prettyPrint") in ("true", "1"))
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
            case [("v1" | "v1beta1"), "projects", project, "locations", location, *rest]:
                return self._vertex_route(method, _project(project), _vertex_location(location), rest)
            case ["v2", "entries:list"]:
                return _pick(method, {"POST": entries.list}), ()
            case ["v1", "projects", _, "models" | "operations", *_]:  # 404: clients retry a 5xx
                raise ApiError(404, "Models and versions (prediction) are not served by aiptrain: it runs AI "
                               "Platform Training jobs (projects.jobs) only.")
        raise ApiError(404, "Not found: this server answers ml v1 projects.jobs and logging v2 entries:list.")


    def _vertex_route(self, method: str, project: str, location: str, rest: list[str]) -> tuple[Handler, tuple]:
        """aiplatform v1's `projects.locations.*` (aiptrain.api.vertex)."""
        methods = self._vertex
        kinds = methods.kinds
        match rest:
            case [kind] if kind in kinds:
                handlers = {"GET": methods.list(kind, kinds[kind].render), "POST": kinds[kind].create}
                return _pick(method, handlers), (project, location)
            case [kind, last] if kind in kinds:
                numeric, _, verb = last.partition(":")
                table = {"": {"GET": methods.get(kind, kinds[kind].render), "DELETE": methods.delete(kind)}}
                if kinds[kind].cancels:
                    table["cancel"] = {"POST": methods.cancel(kind)}
                if verb not in table:
                    raise ApiError(404, f"Method [{verb}] not found on {kind}.")
                resource_id = _named_id(numeric, kind) if kinds[kind].named_ids else _numeric_id(numeric, kind)
                return _pick(method, table[verb]), (project, location, resource_id)
            case ["operations", numeric]:
                return _pick(method, {"GET": methods.get_operation}), (project, location, numeric)
        raise ApiError(404, "Not found: this server answers aiplatform v1 customJobs, hyperparameterTuningJobs, "
                       "trainingPipelines, models and operations of projects.locations.")


def _vertex_location(location: str) -> str:
    if not _LOCATION.fullmatch(location):
        raise ApiError(400, f"Invalid location [{location}]: use a region such as us-central1.")
    return location


def _numeric_id(text: str, kind: str) -> str:
    if not text.isdigit() or len(text) > 20:
        raise ApiError(400, f"Invalid resource ID [{text}] of {kind}: the server gives numeric IDs; use the "
                       "number at the end of the name the create returned.")
    return text


def _named_id(text: str, kind: str) -> str:
    """A resource ID the client may have chosen (a Model's modelId) or the server's number, and a
    version or alias after `@`."""
    if not _NAMED_ID.fullmatch(text):
        raise ApiError(400, f"Invalid resource ID [{text}] of {kind}: use the ID at the end of its name (digits, "
                       "or a-z, 0-9, _ and -), with @VERSION or @ALIAS for one version.")
    return text


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

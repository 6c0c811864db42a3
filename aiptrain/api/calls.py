"""What a method handler of the REST API sees and answers: the request, the parsed call, the
response and Google's error body. Their own module, below the app and its method modules, so
that app.py routes to jobs.py and entries.py without either importing app.py back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from aiptrain.api.access import Access, Grant

MAX_BODY_BYTES = 1 << 20
STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
          409: "ALREADY_EXISTS", 413: "INVALID_ARGUMENT", 500: "INTERNAL", 503: "UNAVAILABLE"}
# Query parameters every Google API takes (system parameters); the rest are the method's own.
# (`$alt=json;enum-encoding=int` is what the generated REST transports of google-cloud-* send.)
SYSTEM_PARAMETERS = frozenset({"alt", "$alt", "prettyPrint", "fields", "key", "quotaUser", "$.xgafv", "callback",
                               "access_token", "upload_protocol", "uploadType", "oauth_token"})


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
    # Indented only when the caller asks (`prettyPrint=true`): Python's encoder indents in pure
    # Python, five times the time of the compact form (half a millisecond for a page of 20 jobs).
    pretty: bool = False

    def encoded(self) -> bytes:
        if self.data is not None:
            return self.data
        return json.dumps(self.body, indent=2 if self.pretty else None).encode() + b"\n"


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


def error_response(code: int, message: str, status: str | None = None) -> Response:
    """Google's error body; a code without a canonical status of its own takes its class's."""
    status = status or STATUS.get(code) or ("UNIMPLEMENTED" if code == 501 else
                                            "INVALID_ARGUMENT" if code < 500 else "INTERNAL")
    return Response(code, {"error": {"code": code, "message": message, "status": status}})

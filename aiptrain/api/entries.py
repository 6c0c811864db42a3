"""Cloud Logging's `entries.list` (POST /v2/entries:list) over the job logs aiptrain keeps
(aiptrain.logs), answering what gcloud's stream-logs asks:

    {"resourceNames": ["projects/P"],
     "filter": "resource.type=\\"ml_job\\" AND resource.labels.job_id=\\"J\\" [AND resource.labels.task_name=\\"T\\"]
                [AND timestamp>\\"2026-01-01T00:00:00Z\\"]",
     "orderBy": "timestamp asc", "pageSize": 1000, "pageToken": "..."}

The filter must name one job (`resource.labels.job_id="J"` at its top level); the rest of it
is evaluated on each entry with aiptrain.filtering, timestamps compared to the microsecond.
Entries come in the order the job's log holds them; a page token is the byte offset where the
next page starts, so lines appended meanwhile are neither skipped nor repeated.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import datetime, timezone

from aiptrain import filtering
from aiptrain.api.app import ApiError, Call
from aiptrain.settings import Settings

PAGE_SIZE, MOST = 50, 1000  # Logging's default and maximum pageSize
SCAN_LINES = 100_000  # lines looked at per request: a sparse filter on a huge log answers in pages
MAX_LINE_BYTES = 4 << 20
_JOB_KEY = "resource.labels.job_id"
_MOMENT = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")
_ORDERS = {"": False, "timestamp asc": False, "timestamp desc": True}


class EntryMethods:
    def __init__(self, settings: Settings):
        self.settings = settings

    def list(self, call: Call) -> dict:
        call.accept()
        body = call.json_body()
        unknown = sorted(set(body) - {"resourceNames", "projectIds", "filter", "orderBy", "pageSize", "pageToken"})
        if unknown:
            raise ApiError(400, f"Invalid JSON payload received. Unknown name \"{unknown[0]}\".")
        projects = _projects(body)
        for project in projects:
            call.authorize(project, write=False)
        expression = _parse_filter(body.get("filter"))
        job_id = _job_of(expression)
        descending = _order(body.get("orderBy"))
        page_size = _page_size(body.get("pageSize"))
        start = _decode_token(body.get("pageToken") or "")
        from aiptrain.client import Client

        with Client(settings=self.settings) as client:
            from aiptrain.validation import JOB_ID_PATTERN

            if not JOB_ID_PATTERN.fullmatch(job_id) or not client.store.exists(job_id):
                return {}
            project = client.recorded_project(job_id) or self.settings.default_project
        if project not in projects:
            return {}
        path = self.settings.job_log_path(job_id)
        if descending:
            entries, next_start = _read_descending(path, project, job_id, expression, page_size, start)
        else:
            entries, next_start = _read(path, project, job_id, expression, page_size, start)
        answer: dict = {"entries": entries} if entries else {}
        if next_start is not None:
            answer["nextPageToken"] = _encode_token(next_start)
        return answer


def _projects(body: dict) -> list[str]:
    names = body.get("resourceNames") or [f"projects/{p}" for p in body.get("projectIds") or []]
    if not isinstance(names, list) or not names:
        raise ApiError(400, "resourceNames is required: name the project, e.g. [\"projects/my-project\"].")
    projects = []
    for name in names:
        match = re.fullmatch(r"projects/([A-Za-z0-9][A-Za-z0-9._:-]{0,99})", name) if isinstance(name, str) else None
        if not match:
            raise ApiError(400, f"resourceNames entry [{name}] is not served: use projects/PROJECT.")
        projects.append(match.group(1))
    return projects


def _parse_filter(text: object) -> filtering.Expr:
    if not isinstance(text, str) or not text.strip():
        raise ApiError(400, f"filter is required and must name the job: {_JOB_KEY}=\"JOB\".")
    if len(text) > 20_000:
        raise ApiError(400, "filter is longer than 20,000 characters.")
    try:
        expression = filtering.parse(text)
    except filtering.FilterSyntaxError as exc:
        raise ApiError(400, f"Invalid filter [{text}]: {str(exc).split(']: ', 1)[-1]}") from None
    _check_moments(expression)
    return expression


def _job_of(expression: filtering.Expr) -> str:
    """The job a filter names at its top level (every entry it matches belongs to that job)."""
    operands = expression.operands if isinstance(expression, filtering.BoolOp) and expression.op == "AND" else (
        expression,)
    for operand in operands:
        if isinstance(operand, filtering.Term) and operand.key == _JOB_KEY and operand.op == "=" \
                and len(operand.values) == 1:
            return operand.values[0]
    raise ApiError(400, f"The filter must name one job at its top level: add AND {_JOB_KEY}=\"JOB\".")


def _check_moments(expression: filtering.Expr) -> None:
    for term in _terms(expression):
        if term.key == "timestamp":
            if term.op not in ("<", "<=", ">", ">=", "=", "!="):
                raise ApiError(400, f"timestamp takes <, <=, >, >=, = or !=, not [{term.op}].")
            for value in term.values:
                if _moment(value) is None:
                    raise ApiError(400, f"timestamp [{value}] is not an RFC 3339 time such as 2026-01-01T00:00:00Z.")


def _terms(expression: filtering.Expr):
    if isinstance(expression, filtering.Term):
        yield expression
    elif isinstance(expression, filtering.Not):
        yield from _terms(expression.operand)
    else:
        for operand in expression.operands:
            yield from _terms(operand)


def _moment(text: str) -> datetime | None:
    match = _MOMENT.fullmatch(text.strip())
    if not match:
        return None
    whole, fraction, zone = match.groups()
    micro = (fraction or "").ljust(6, "0")[:6]
    try:
        return datetime.fromisoformat(f"{whole}.{micro}{'+00:00' if zone == 'Z' else zone}")
    except ValueError:
        return None


def matches(expression: filtering.Expr, entry: dict) -> bool:
    """aiptrain.filtering's evaluation, with `timestamp` compared as an instant to the microsecond
    (filtering compares times to the second, which would drop or repeat lines when polling)."""
    if isinstance(expression, filtering.Term):
        if expression.key != "timestamp":
            return filtering.evaluate(expression, entry)
        moment = _moment(entry["timestamp"])
        found = any(_compare(moment, expression.op.lstrip("!"), _moment(v)) for v in expression.values)
        return not found if expression.op == "!=" else found
    if isinstance(expression, filtering.Not):
        return not matches(expression.operand, entry)
    results = (matches(operand, entry) for operand in expression.operands)
    return all(results) if expression.op == "AND" else any(results)


def _compare(left: datetime, op: str, right: datetime) -> bool:
    return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right, "=": left == right}[op]


def entry_of(record: dict, project: str, job_id: str, offset: int) -> dict:
    """A job-log record (aiptrain.logs.record_line) as a Cloud Logging LogEntry of an ml_job."""
    task = record.get("task") or "unknown_task"
    labels = {"ml.googleapis.com/task_name": task}
    if record.get("trial"):
        labels["ml.googleapis.com/trial_id"] = record["trial"]
    return {
        "logName": f"projects/{project}/logs/{task}",
        "resource": {"type": "ml_job", "labels": {"project_id": project, "job_id": job_id, "task_name": task}},
        "timestamp": record.get("time", ""),
        "receiveTimestamp": record.get("time", ""),
        "severity": record.get("severity") or "DEFAULT",
        "insertId": f"{offset:x}",
        "labels": labels,
        "jsonPayload": {"message": record.get("message", "")},
    }


def _lines(path, start: int):
    """(offset, record) of each whole line from byte `start`; a line still being written, or one
    longer than MAX_LINE_BYTES, ends the reading."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return
    with handle:
        handle.seek(start)
        offset = start
        while True:
            line = handle.readline(MAX_LINE_BYTES)
            if not line.endswith(b"\n"):
                return
            if line.strip():
                try:
                    yield offset, json.loads(line)
                except ValueError:
                    pass  # a damaged line is not an entry
            offset += len(line)


def _read(path, project: str, job_id: str, expression, page_size: int, start: int) -> tuple[list, int | None]:
    """Entries in the log's order from byte `start`: (the page, where the next one starts or None)."""
    entries: list[dict] = []
    scanned = 0
    for offset, record in _lines(path, start):
        if len(entries) == page_size or scanned == SCAN_LINES:
            return entries, offset
        scanned += 1
        entry = entry_of(record, project, job_id, offset)
        if matches(expression, entry):
            entries.append(entry)
    return entries, None


def _read_descending(path, project: str, job_id: str, expression, page_size: int,
                     start: int) -> tuple[list, int | None]:
    """Newest first: every matching entry is gathered, `start` counts the ones already given."""
    matching = [entry for offset, record in _lines(path, 0)
                if matches(expression, entry := entry_of(record, project, job_id, offset))]
    matching.sort(key=lambda entry: _moment(entry["timestamp"]) or datetime.min.replace(tzinfo=timezone.utc),
                  reverse=True)
    page = matching[start:start + page_size]
    return page, (start + page_size if start + page_size < len(matching) else None)


def _order(order_by: object) -> bool:
    key = " ".join(str(order_by or "").split()).lower()
    if not isinstance(order_by, (str, type(None))) or key not in _ORDERS:
        raise ApiError(400, f"orderBy [{order_by}] is not served: use \"timestamp asc\" or \"timestamp desc\".")
    return _ORDERS[key]


def _page_size(value: object) -> int:
    if value is None:
        return PAGE_SIZE
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ApiError(400, f"pageSize [{value}] must be a whole number from 0 to {MOST}.")
    return min(value, MOST) or PAGE_SIZE


def _encode_token(offset: int) -> str:
    return base64.urlsafe_b64encode(str(offset).encode()).decode()


def _decode_token(token: object) -> int:
    if not token:
        return 0
    try:
        text = base64.urlsafe_b64decode(str(token).encode()).decode()
        if not text.isdigit():
            raise ValueError
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ApiError(400, "Invalid pageToken: pass the nextPageToken of the previous page unchanged.") from None
    return int(text)

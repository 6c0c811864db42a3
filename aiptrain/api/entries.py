"""Cloud Logging's `entries.list` (POST /v2/entries:list) over the job logs aiptrain keeps
(aiptrain.logs), answering what gcloud's stream-logs asks:

    {"resourceNames": ["projects/P"],
     "filter": "resource.type=\\"ml_job\\" AND resource.labels.job_id=\\"J\\" [AND resource.labels.task_name=\\"T\\"]
                [AND timestamp>\\"2026-01-01T00:00:00Z\\"]",
     "orderBy": "timestamp asc", "pageSize": 1000, "pageToken": "..."}

The filter must name one job (`resource.labels.job_id="J"` at its top level); the rest of it
is evaluated on each entry with aiptrain.filtering, timestamps compared to the microsecond.
Entries come sorted by (timestamp, insertId), as Cloud Logging sorts them and as gcloud's
LogFetcher relies on (it drops an entry older than the last it saw, and asks for the next ones
with `((timestamp="T" AND insertId>"I") OR timestamp>"T")`). insertId is the line's byte offset
in the job's log, 20 digits, so it sorts in the order lines were written. A page token
names the last entry given, so lines appended meanwhile neither shift nor repeat pages.

Whose log a job ID names is asked of `finders` in turn (`LogSource`): an ml v1 job by its ID
here; the server adds Vertex AI's jobs by their numeric IDs (aiptrain.vertex.logs), whose
entries name their tasks and write their messages in Vertex's words.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from aiptrain import filtering
from aiptrain.api.calls import ApiError, Call
from aiptrain.client import Client
from aiptrain.settings import Settings
from aiptrain.validation import JOB_ID_PATTERN

PAGE_SIZE, MOST = 50, 1000  # Logging's default and maximum pageSize
MAX_LINE_BYTES = 4 << 20
_JOB_KEY = "resource.labels.job_id"
_MOMENT = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")
_ORDERS = {"": False, "timestamp asc": False, "timestamp desc": True}


def _same(text: str) -> str:
    return text


def _as_written(task: str, text: str) -> str:
    return text


@dataclass(frozen=True)
class LogSource:
    """The log of the job a filter names, and how its entries name tasks and word messages."""

    job_key: str  # the ml v1 job whose log it is
    task_name: Callable[[str], str] = _same  # a log record's task -> resource.labels.task_name
    message: Callable[[str, str], str] = _as_written  # a record's (task, message) -> jsonPayload.message


# Whose log `resource.labels.job_id="ID"` names in a project: (client, project, ID) -> LogSource.
Finder = Callable[[Client, str, str], "LogSource | None"]


def ml_job(client: Client, project: str, job_id: str) -> LogSource | None:
    """An ml v1 job's log, by its job ID."""
    if not JOB_ID_PATTERN.fullmatch(job_id):
        return None
    key = client.store.key_of(project, job_id)
    return LogSource(key) if key else None


class EntryMethods:
    def __init__(self, settings: Settings, finders: Sequence[Finder] = (ml_job,)):
        self.settings = settings
        self._finders = tuple(finders)

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
        start = _decode_token(body.get("pageToken"))
        with Client(settings=self.settings) as client:  # job IDs are per project: the first named that has it
            found_in = [(p, source) for p in projects if (source := self._source(client, p, job_id))]
        if not found_in:
            return {}
        project, source = found_in[0]
        found = _matching(self.settings.job_paths(source.job_key).log, project, job_id, source, expression)
        if descending:
            found.reverse()
        if start is not None:
            found = [entry for entry in found if (_key(entry) < start if descending else _key(entry) > start)]
        page = found[:page_size]
        answer: dict = {"entries": page} if page else {}
        if len(found) > page_size:
            answer["nextPageToken"] = _encode_token(page[-1])
        return answer

    def _source(self, client: Client, project: str, job_id: str) -> LogSource | None:
        return next((source for find in self._finders if (source := find(client, project, job_id))), None)


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
        moment = _moment(entry["timestamp"]) or _NEVER  # a line without a time: before all, as _key sorts it
        wanted = [w for w in map(_moment, expression.values) if w is not None]  # all of them: _check_moments
        found = any(_compare(moment, expression.op.lstrip("!"), w) for w in wanted)
        return not found if expression.op == "!=" else found
    if isinstance(expression, filtering.Not):
        return not matches(expression.operand, entry)
    results = (matches(operand, entry) for operand in expression.operands)
    return all(results) if expression.op == "AND" else any(results)


def _compare(left: datetime, op: str, right: datetime) -> bool:
    return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right, "=": left == right}[op]


def entry_of(record: dict, project: str, job_id: str, offset: int, source: LogSource | None = None) -> dict:
    """A job-log record (aiptrain.logs.record_line) as a Cloud Logging LogEntry of an ml_job,
    named and worded as `source` says."""
    source = source or LogSource("")
    written_by = record.get("task") or "unknown_task"
    task, message = source.task_name(written_by), source.message(written_by, record.get("message", ""))
    labels = {"ml.googleapis.com/task_name": task}
    if record.get("trial"):
        labels["ml.googleapis.com/trial_id"] = record["trial"]
    return {
        "logName": f"projects/{project}/logs/{task}",
        "resource": {"type": "ml_job", "labels": {"project_id": project, "job_id": job_id, "task_name": task}},
        "timestamp": record.get("time", ""),
        "receiveTimestamp": record.get("time", ""),
        "severity": record.get("severity") or "DEFAULT",
        "insertId": f"{offset:020d}",  # fixed-width digits: in order as text and as numbers (hex "1e5" is not)
        "labels": labels,
        "jsonPayload": {"message": message},
    }


def _lines(path):
    """(offset, record) of each whole line of the job's log; a line still being written ends the
    reading, one longer than MAX_LINE_BYTES is skipped."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - only a missing file is caught, not a failed read
    except FileNotFoundError:
        return
    with handle:
        offset = 0
        while True:
            line = handle.readline(MAX_LINE_BYTES)
            if not line.endswith(b"\n"):
                if len(line) < MAX_LINE_BYTES:
                    return  # the end, or a line still being written
                while line and not line.endswith(b"\n"):  # a line too long to be an entry: skipped
                    offset += len(line)
                    line = handle.readline(MAX_LINE_BYTES)
                offset += len(line)
                continue
            if line.strip():
                try:
                    yield offset, json.loads(line)
                except ValueError:
                    pass  # a damaged line is not an entry
            offset += len(line)


def _matching(path, project: str, job_id: str, source: LogSource, expression) -> list[dict]:
    """The log's entries that match, sorted by (timestamp, insertId)."""
    found = [entry for offset, record in _lines(path)
             if matches(expression, entry := entry_of(record, project, job_id, offset, source))]
    found.sort(key=_key)
    return found


_NEVER = datetime.min.replace(tzinfo=timezone.utc)


def _key(entry: dict) -> tuple[datetime, str]:
    return _moment(entry["timestamp"]) or _NEVER, entry["insertId"]


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


def _encode_token(entry: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps([entry["timestamp"], entry["insertId"]]).encode()).decode()


def _decode_token(token: object) -> tuple[datetime, str] | None:
    if not token:
        return None
    try:
        stamp, insert_id = json.loads(base64.urlsafe_b64decode(str(token).encode()))
        moment = _moment(stamp) if isinstance(stamp, str) else None
        if moment is None or not isinstance(insert_id, str):
            raise ValueError
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise ApiError(400, "Invalid pageToken: pass the nextPageToken of the previous page unchanged.") from None
    return moment, insert_id

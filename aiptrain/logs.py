"""Job logs: one JSON-lines file per job, written by the supervisor (replica output)
and by submit (service messages), read by any number of `stream-logs` readers.

The file outlives the containers, so logs of finished jobs stay readable, replica
restarts need no re-attaching by readers, and readers never touch Docker. Lines are
printed in gcloud's format: severity, local timestamp, task name, trial ID and
message, separated by tabs.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

SERVICE = "service"
# The last line a supervisor writes for each way a job ends, after tearing it down and just
# before it records the final state.
CLOSING_LINES = frozenset({"Job completed successfully.", "Job failed.", "Job cancelled."})
# After a closing line the final state follows within milliseconds: look again this soon, for a while.
CLOSING_POLL_SECONDS, CLOSING_POLLS = 0.01, 100
# Between looks at the job, a follower watches the log file's size this often (a stat: cheap).
GROWTH_POLL_SECONDS = 0.02

# Severity prefixes that Python logging, absl/TensorFlow C++ and glog put on stderr lines.
_PY_LOGGING = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL)[:\s]")
_ABSL = re.compile(r"([IWEF])\d{4} \d\d:\d\d:\d\d")
_TF_CPP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([IWEF]) ")
_LETTER = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}


@dataclass(frozen=True)
class LogRecord:
    time: str  # RFC 3339 in UTC
    task: str  # master-replica-0, worker-replica-1, service
    severity: str
    message: str
    trial: str = ""


# Control characters a terminal acts on (ESC sequences, BEL, carriage returns, C1 codes),
# tab and newline excepted.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, one_line: bool = False) -> str:
    """`text` with terminal control characters shown as escapes (`\\x1b`), so a trainer's
    output or a mistyped argument cannot move the cursor, retitle or recolor a terminal.
    Tabs and newlines stay, unless `one_line` (a value echoed inside a message)."""
    escaped = _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return escaped.replace("\t", "\\t").replace("\n", "\\n") if one_line else escaped


def severity_of(stream: str, text: str) -> str:
    """stdout is INFO (print); stderr keeps a level it names, else ERROR."""
    if stream == "stdout":
        return "INFO"
    for pattern in (_PY_LOGGING, _ABSL, _TF_CPP):
        match = pattern.match(text)
        if match:
            return _LETTER.get(match.group(1), match.group(1))
    return "ERROR"


def parse_engine_time(stamp: str) -> int:
    """Nanoseconds since the epoch from an RFC 3339 time with up to nanoseconds (trailing zeros
    trimmed), as engines stamp log lines."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    seconds = int(datetime.fromisoformat(head + "+00:00").timestamp())
    return seconds * 1_000_000_000 + int((frac + "000000000")[:9])


def now_stamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _local_time(stamp: str) -> str:
    return _local_second(stamp.rstrip("Z").partition(".")[0])


@functools.lru_cache(maxsize=4096)
def _local_second(head: str) -> str:
    """Lines come many to a second: convert each second once."""
    moment = datetime.fromisoformat(head).replace(tzinfo=timezone.utc).astimezone()
    return moment.strftime("%Y-%m-%d %H:%M:%S %z")


def format_record(record: LogRecord, allow_multiline: bool = False) -> list[str]:
    """gcloud's `value(severity, timestamp, task_name, trial_id, message)`: one output line per
    message line unless multi-line messages are allowed."""
    prefix = f"{record.severity}\t{_local_time(record.time)}\t{record.task}\t{record.trial}\t"
    lines = [record.message] if allow_multiline else record.message.split("\n")
    return [prefix + line for line in lines]


class JobLogWriter:
    """Appends records to a job's log file; safe to share between threads."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def write(self, task: str, severity: str, message: str, stamp: str | None = None, trial: str = "") -> None:
        record = LogRecord(stamp or now_stamp(), task, severity, message, trial)
        line = (json.dumps(asdict(record)) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)  # one write per record: appends never interleave

    def service(self, message: str, severity: str = "INFO", trial: str = "") -> None:
        self.write(SERVICE, severity, message, trial=trial)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> "JobLogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_records(path: Path, offset: int = 0) -> tuple[list[LogRecord], int]:
    """Complete records from `offset` on, and the offset after the last complete one."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1  # a record still being written is left for the next read
    records = [LogRecord(**json.loads(line)) for line in data[:end].splitlines() if line.strip()]
    return records, offset + end


def last_times_by_task(path: Path) -> dict[tuple[str, str], str]:
    """The newest record time of each (trial, task): where a re-attached log follower resumes."""
    latest: dict[tuple[str, str], str] = {}
    for record in read_records(path)[0]:
        latest[(record.trial, record.task)] = record.time
    return latest


def follow(
    path: Path, is_done: Callable[[], bool], poll_seconds: float = 0.2, task: str | None = None
) -> Iterator[list[LogRecord]]:
    """Batches of the job's records: all there are, then new ones as they come, until
    `is_done()` and the file has been read to its end. The supervisor writes its last
    records before it marks the job finished, so nothing written is missed."""
    offset, quick_polls = 0, 0
    while True:
        done = is_done()  # checked before reading, so a final read always follows "done"
        records, offset = read_records(path, offset)
        size = _size(path)  # after the read: what a further write will grow
        batch = [r for r in records if task is None or r.task == task]
        if batch:
            yield batch
        if done:
            return
        if any(r.task == SERVICE and not r.trial and r.message in CLOSING_LINES for r in records):
            quick_polls = CLOSING_POLLS
        if not records:
            quick_polls = max(0, quick_polls - 1)
            if quick_polls:
                time.sleep(CLOSING_POLL_SECONDS)
            else:
                wait_for_growth(path, size, poll_seconds)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def wait_for_growth(path: Path, size: int, seconds: float) -> None:
    """Sleep up to `seconds`, waking as soon as the file is larger than `size`: new lines are
    read within GROWTH_POLL_SECONDS of being written, the job itself is looked at every `seconds`."""
    deadline = time.monotonic() + seconds
    while _size(path) <= size:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(GROWTH_POLL_SECONDS, left))

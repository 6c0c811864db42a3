"""Job logs: one JSON-lines file per job, written by the controller (replica output)
and by submit (service messages), read by any number of `stream-logs` readers.

The file outlives the containers, so logs of finished jobs stay readable, replica
restarts need no re-attaching by readers, and readers never touch Docker. Lines are
printed in gcloud's format: severity, local timestamp, task name, trial ID and
message, separated by tabs.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

SERVICE = "service"
# The last line the controller writes for each way a job ends, after tearing it down and just
# before it records the final state.
CLOSING_LINES = frozenset({"Job completed successfully.", "Job failed.", "Job cancelled."})
# After a closing line the final state follows within milliseconds: a follower asks this often
# whether the job ended, for a while, instead of every poll.
CLOSING_POLL_SECONDS, CLOSING_PATIENCE_SECONDS = 0.01, 1.0
_CLOSING_MESSAGES = tuple(json.dumps(line).encode() for line in CLOSING_LINES)

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


def format_lines(data: bytes, allow_multiline: bool = False, task: str | None = None) -> str:
    """The gcloud lines of a block of complete job-log lines (of `task` only, when given), as
    "\n".join(format_record(r) for each record) gives them, without building a record per line:
    what `stream-logs` prints through a pipe, a million lines at a time."""
    out: list[str] = []
    append = out.append
    last_head, local = None, ""
    for entry in _parse_block(data):
        if task is not None and entry["task"] != task:
            continue
        stamp = entry["time"]
        head = stamp.rstrip("Z").partition(".")[0]
        if head != last_head:  # consecutive lines mostly share their second
            last_head, local = head, _local_second(head)
        prefix = f"{entry['severity']}\t{local}\t{entry['task']}\t{entry.get('trial', '')}\t"
        message = entry["message"]
        if not allow_multiline and "\n" in message:
            message = message.replace("\n", "\n" + prefix)
        append(prefix + message)
    return "\n".join(out)


def _parse_block(data: bytes) -> list[dict]:
    """The records of complete JSON lines as dicts: one json.loads for the whole block, as an
    array (per-line calls cost more than the parsing); line by line if that fails, so a line
    only of blanks is skipped and a broken one raises as it always did."""
    try:
        return json.loads(b"[" + b",".join(filter(None, data.split(b"\n"))) + b"]")
    except ValueError:
        return [json.loads(line) for line in data.splitlines() if line.strip()]


def record_line(stamp: str, task: str, severity: str, message: str, trial: str = "") -> str:
    """A record as its job-log line: exactly json.dumps(asdict(LogRecord(...))) + newline (the
    format every log has), without the dict and the encoder around the strings."""
    return (f'{{"time": {_quote(stamp)}, "task": {_quote(task)}, "severity": {_quote(severity)}, '
            f'"message": {_quote(message)}, "trial": {_quote(trial)}}}\n')


_quote = json.encoder.encode_basestring_ascii  # what json.dumps does to a string (ensure_ascii)


class JobLogWriter:
    """Appends records to a job's log file; safe to share between threads."""

    def __init__(self, path: Path, keep_going: bool = False):
        """`keep_going`: lines that do not fit on a full disk are dropped and counted (`lost`)
        instead of raising, so the controller goes on driving the job."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        self._keep_going = keep_going
        self.lost = 0  # lines dropped because the disk was full

    def write(self, task: str, severity: str, message: str, stamp: str | None = None, trial: str = "") -> None:
        self.write_lines([record_line(stamp or now_stamp(), task, severity, message, trial)])

    def write_lines(self, lines: list[str]) -> None:
        """Lines of record_line, in one append: readers never see records interleaved, and a
        replica's burst of output costs one system call."""
        data = "".join(lines).encode()
        with self._lock:
            written = 0
            try:
                while written < len(data):
                    written += os.write(self._fd, data[written:])
            except OSError as exc:
                if written:  # no half record: readers would take the next one as its end
                    os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
                if not (self._keep_going and exc.errno in (errno.ENOSPC, errno.EDQUOT)):
                    raise
                self.lost += len(lines)

    def service(self, message: str, severity: str = "INFO", trial: str = "") -> None:
        self.write(SERVICE, severity, message, trial=trial)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> JobLogWriter:
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
    return records_of(data[:end]), offset + end


def records_of(data: bytes, task: str | None = None) -> list[LogRecord]:
    """The records (of `task` only, when given) of a block of complete job-log lines."""
    return [LogRecord(**entry) for entry in _parse_block(data) if task is None or entry["task"] == task]


def records_of_task(path: Path, task: str) -> list[LogRecord]:
    """The records of one task, without parsing the others' (a job log may hold millions of
    lines): a line is parsed only if it holds the task's field as record_line writes it."""
    field = f'"task": {_quote(task)}, '.encode()
    found: list[LogRecord] = []
    for block in _blocks_of(path):
        found += records_of(b"\n".join(line for line in block.split(b"\n") if field in line), task)
    return found


def last_times_by_task(path: Path) -> dict[tuple[str, str], str]:
    """The newest record time of each (trial, task): where a re-attached log follower resumes."""
    latest: dict[tuple[str, str], str] = {}
    for block in _blocks_of(path):
        for entry in _parse_block(block):
            latest[(entry.get("trial", ""), entry["task"])] = entry["time"]
    return latest


def _blocks_of(path: Path) -> Iterator[bytes]:
    """The file in blocks of about BLOCK_BYTES of whole lines; a last line still being written
    is left out. Nothing when there is no file."""
    try:
        with path.open("rb") as handle:
            while True:
                data = handle.read(BLOCK_BYTES) + handle.readline()
                block = data[:data.rfind(b"\n") + 1]
                if not block:
                    return
                yield block
    except FileNotFoundError:
        return


# How long a follower waits before looking at the file again when it had nothing new: what a
# line may lag behind its writing, for the cost of a read() call 20 times a second. Lines come in
# bursts (a job's start, its end), so for a second after new ones it looks five times as often:
# a short job's end reaches `--stream-logs` 10 ms after it is written instead of up to 50.
IDLE_READ_SECONDS = 0.05
BUSY_READ_SECONDS, BUSY_FOR_SECONDS = 0.01, 1.0
BLOCK_BYTES = 1 << 20  # read at most this much at a time: a finished job's log may hold gigabytes


def follow_blocks(path: Path, is_done: Callable[[], bool], poll_seconds: float = 0.2) -> Iterator[bytes]:
    """Blocks of complete lines of the job log: all there are, then new ones as they come,
    until `is_done()` and the file has been read to its end. The controller writes its last
    records before it marks the job finished, so nothing written is missed. The file is looked
    at every IDLE_READ_SECONDS when nothing came (BUSY_READ_SECONDS for a while after something
    did), `is_done` asked every `poll_seconds`."""
    handle = None
    pending = b""  # a line still being written
    done, next_check, interval, quick_until = False, 0.0, poll_seconds, 0.0
    busy_until = time.monotonic() + BUSY_FOR_SECONDS  # a follower starts with the job, or its end
    try:
        while True:
            now = time.monotonic()
            if not done and now >= next_check:
                done = is_done()  # asked before reading, so a final read always follows "done"
                interval = CLOSING_POLL_SECONDS if now < quick_until else poll_seconds
                next_check = time.monotonic() + interval
            if handle is None:
                handle = _open_for_reading(path)
            data = handle.read(BLOCK_BYTES) if handle else b""
            if data:
                pending += data
                end = pending.rfind(b"\n") + 1
                if end:
                    block, pending = pending[:end], pending[end:]
                    if any(message in block for message in _CLOSING_MESSAGES):  # the end is near
                        quick_until, next_check = time.monotonic() + CLOSING_PATIENCE_SECONDS, 0.0
                    busy_until = time.monotonic() + BUSY_FOR_SECONDS
                    yield block
                continue  # there may be more right away
            if done:
                return
            idle = BUSY_READ_SECONDS if time.monotonic() < busy_until else IDLE_READ_SECONDS
            time.sleep(min(idle, interval))
    finally:
        if handle:
            handle.close()


def _open_for_reading(path: Path):
    try:
        return open(path, "rb", buffering=0)  # each read() a system call: nothing is cached past the end
    except FileNotFoundError:
        return None


def follow(
    path: Path, is_done: Callable[[], bool], poll_seconds: float = 0.2, task: str | None = None
) -> Iterator[list[LogRecord]]:
    """Batches of the job's records (of `task` only, when given), as follow_blocks reads them."""
    for block in follow_blocks(path, is_done, poll_seconds):
        batch = records_of(block, task)
        if batch:
            yield batch

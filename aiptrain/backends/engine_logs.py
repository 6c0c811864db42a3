"""The engine's log stream, decoded: what `docker logs` reads, without docker-py's per-line cost.

The engine multiplexes stdout and stderr into frames (an 8-byte header: stream id, size; then
the message), sends each message as an HTTP chunk of its own, and cuts lines longer than 16 KB
into parts. Both backends read a replica's output through here.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

from aiptrain.backends import LogChunk
from aiptrain.logs import parse_engine_time

# The engine logs lines longer than this in parts; it writes a stopped replica's last part up to
# a few hundred milliseconds after its follow ended.
ENGINE_PART_BYTES = 16 * 1024
LAST_PART_PATIENCE_SECONDS = 3.0
# (since_ns, follow) -> batches of (stream id, message) pairs, in the engine's order
Frames = Callable[[int | None, bool], Iterator[list[tuple[int, bytes]]]]


def read_log_lines(frames: Frames, since_ns: int | None, read_again: bool = False) -> Iterator[list[LogChunk]]:
    """A replica's log lines, in batches (the lines that arrived together), from its engine's
    messages: `frames(since_ns, follow)` yields batches of (stream id, message) pairs. The follow
    can end before the engine has written the last part of a long line (the engine cuts lines
    into 16 KB parts), so while a line still lacks its end, plain reads follow, briefly; then a
    last line without a newline is flushed. `read_again`: one plain read after the follow in any
    case, for engines whose follow is ended by the caller rather than by the replica's end
    (Swarm's service logs)."""
    reader = _LogReader(frames, since_ns)
    yield from reader.read(follow=True)
    if read_again:
        yield from reader.read(follow=False)
    deadline = time.monotonic() + LAST_PART_PATIENCE_SECONDS
    while reader.awaits_more() and time.monotonic() < deadline:
        time.sleep(0.1)
        yield from reader.read(follow=False)
    last = list(reader.flush())
    if last:
        yield last


_STREAMS = {1: "stdout", 2: "stderr"}


class _LineAssembler:
    """Lines from the engine's log messages. Each frame is one message stamped `TIME TEXT`;
    the engine cuts lines longer than 16 KB into parts without a newline (each stamped again),
    and the last line of a replica may have none. Parts are joined as bytes, so a character
    cut in two is whole again; a line keeps the time of its first part."""

    def __init__(self) -> None:
        self._stamp: bytes | None = None
        self._parts: list[bytes] = []

    def feed(self, data: bytes) -> list[tuple[str, bytes]]:
        stamp, _, text = data.partition(b" ")
        newline = text.find(b"\n")
        if newline == len(text) - 1 and newline >= 0 and not self._parts:  # the usual: one whole line
            return [(stamp.decode(errors="replace"), text[:-1])]
        lines = []
        *complete, rest = text.split(b"\n")
        for piece in complete:
            lines.append(((self._stamp or stamp).decode(errors="replace"), b"".join([*self._parts, piece])))
            self._stamp, self._parts = None, []
        if rest:
            self._stamp = self._stamp or stamp
            self._parts.append(rest)
        return lines

    def awaits_more(self) -> bool:
        """True while the pending line ends with a whole 16 KB part: the engine has more of it."""
        return bool(self._parts) and len(self._parts[-1]) == ENGINE_PART_BYTES

    def flush(self) -> Iterator[tuple[str, bytes]]:
        if self._stamp is not None:
            yield self._stamp.decode(errors="replace"), b"".join(self._parts)
        self._stamp, self._parts = None, []


class _LogReader:
    """Reads a container's log messages into lines: following, then, if needed, plainly again
    from the same start, skipping the messages already read (the engine's last part of a line
    may be stamped before the parts it follows, so a later `since` could miss it)."""

    def __init__(self, frames: Frames, since_ns: int | None):
        # (since_ns, follow) -> batches of (stream id, message) pairs, in the engine's order
        self._frames = frames
        self._since_ns = since_ns
        self._read = 0
        self._lines = {1: _LineAssembler(), 2: _LineAssembler()}

    def read(self, follow: bool) -> Iterator[list[LogChunk]]:
        position = 0
        for frames in self._frames(self._since_ns, follow):
            batch = []
            for stream_id, data in frames:
                position += 1
                if position <= self._read:
                    continue
                self._read += 1
                if self._since_ns and parse_engine_time(data.partition(b" ")[0].decode()) <= self._since_ns:
                    continue  # the engine's `since` includes that very moment, copied already
                stream = _STREAMS[stream_id]
                for stamp, line in self._lines[stream_id].feed(data):
                    batch.append(_chunk(stream, stamp, line))
            if batch:
                yield batch

    def awaits_more(self) -> bool:
        return any(lines.awaits_more() for lines in self._lines.values())

    def flush(self) -> Iterator[LogChunk]:
        for stream_id, lines in self._lines.items():
            for line_stamp, line in lines.flush():
                yield _chunk(_STREAMS[stream_id], line_stamp, line)


BODY_READ_BYTES = 1 << 20
_FRAME_HEADER = struct.Struct(">BxxxL")  # stream id, 3 bytes padding, payload size


def body_blocks(response: Any) -> Iterator[bytes]:
    """The response's body as it arrives, a block per read of the socket. The engine sends each
    log message as an HTTP chunk of its own; read through urllib3 and http.client, that is several
    Python calls per line, so chunked bodies are read from the socket and unchunked here."""
    http_response = getattr(response.raw, "_fp", None)
    socket_file = getattr(http_response, "fp", None)
    if not getattr(http_response, "chunked", False) or not hasattr(socket_file, "read1"):
        yield from iter(lambda: response.raw.read1(BODY_READ_BYTES), b"")  # another transport
        return
    read1 = socket_file.read1  # type: ignore[union-attr]  # checked just above
    yield from unchunk(lambda: read1(BODY_READ_BYTES))


def unchunk(read: Callable[[], bytes]) -> Iterator[bytes]:
    """HTTP/1.1's chunked transfer coding undone: `read()` gives what arrived (b"" once the
    connection closed); each block of whole chunks comes out joined, until the last chunk."""
    buffer = b""
    while True:
        pieces: list[bytes] = []
        position = 0
        while True:
            line_end = buffer.find(b"\r\n", position)
            if line_end < 0:
                break
            size = int(buffer[position:line_end].partition(b";")[0], 16)
            start = line_end + 2
            if size == 0:
                if pieces:
                    yield b"".join(pieces)
                return
            if start + size + 2 > len(buffer):
                break
            pieces.append(buffer[start:start + size])
            position = start + size + 2
        if pieces:
            yield b"".join(pieces)
        data = read()
        if not data:
            return
        buffer = buffer[position:] + data


def frame_blocks(blocks: Iterator[bytes]) -> Iterator[list[tuple[int, bytes]]]:
    """The engine's multiplexed stream (an 8-byte header: stream id, size; then the payload),
    a batch of (stream id, payload) per block that completed any."""
    pending = b""
    for block in blocks:
        pending = pending + block if pending else block
        frames, position, size = [], 0, len(pending)
        while position + 8 <= size:
            stream_id, length = _FRAME_HEADER.unpack_from(pending, position)
            end = position + 8 + length
            if end > size:
                break
            if stream_id in (1, 2) and length:
                frames.append((stream_id, pending[position + 8:end]))
            position = end
        pending = pending[position:]
        if frames:
            yield frames


def _chunk(stream: str, stamp: str, raw: bytes) -> LogChunk:
    return LogChunk(time=stamp, stream=stream, text=raw.decode(errors="replace").rstrip("\r"))


def open_logs(api: Any, path: str, replica_id: str, since_ns: int | None, follow: bool) -> Any:
    """The engine's log messages of one replica (`path`: its log endpoint, a container's or a
    swarm service's), stdout and stderr apart: docker-py's logs() merges them, and the severity
    of a line depends on its stream, so the multiplexed frames are read directly."""
    params: dict[str, int | str] = {"follow": int(follow), "stdout": 1, "stderr": 1, "timestamps": 1}
    if since_ns:
        params["since"] = f"{since_ns // 1_000_000_000}.{since_ns % 1_000_000_000:09d}"
    response = api._get(api._url(path, replica_id), params=params, stream=True)
    api._raise_for_status(response)
    if follow:
        api._disable_socket_timeout(api._get_raw_response_socket(response))  # follow may wait long
    return response


def log_frames(api: Any, path: str, replica_id: str, since_ns: int | None,
               follow: bool) -> Iterator[list[tuple[int, bytes]]]:
    """The replica's frames in batches, from one request to the engine (`read_log_lines`'s `frames`)."""
    response = open_logs(api, path, replica_id, since_ns, follow)
    try:
        yield from frame_blocks(body_blocks(response))
    finally:
        response.close()

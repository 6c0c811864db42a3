"""Log lines rebuilt from the engine's multiplexed frames: whole however the socket cuts the body,
and a read resumed where the last one ended."""

import struct

import pytest

from aiptrain.backends.engine_logs import ENGINE_PART_BYTES, _LineAssembler, _LogReader, frame_blocks, unchunk


def feed_all(frames: list[bytes]) -> list[tuple[str, bytes]]:
    assembler = _LineAssembler()
    lines = [line for frame in frames for line in assembler.feed(frame)]
    return lines + list(assembler.flush())


@pytest.mark.parametrize(
    "frames, lines",
    [
        ([b"T1 one\n", b"T2 two\n"], [("T1", b"one"), ("T2", b"two")]),
        ([b"T1 one\n", b"T2 last without newline"], [("T1", b"one"), ("T2", b"last without newline")]),
        # Lines over 16 KB come as partial messages, each stamped: one line, the first stamp.
        ([b"T1 aaa", b"T2 bbb", b"T3 ccc\n", b"T4 next\n"], [("T1", b"aaabbbccc"), ("T4", b"next")]),
        ([b"T1 aaa", b"T2 bbb"], [("T1", b"aaabbb")]),
        ([b"T1 \xc3", b"T2 \xa9\n"], [("T1", "\u00e9".encode())]),  # a character cut in two
        ([b"T1 \n"], [("T1", b"")]),
        ([b"T1 a\nb\n"], [("T1", b"a"), ("T1", b"b")]),
    ],
)
def test_lines_are_rebuilt_from_the_engines_messages(frames, lines):
    assert feed_all(frames) == lines


def test_a_read_again_finds_the_last_part_the_follow_ended_before():
    """The engine may write a stopped replica's last part after its follow ended, stamped
    before the part it follows: the plain read starts where the follow did and skips by count."""
    part = b"a" * ENGINE_PART_BYTES
    messages = [(1, b"2026-01-01T00:00:01.000000000Z before\n"), (2, b"2026-01-01T00:00:02.000000000Z " + part),
                (2, b"2026-01-01T00:00:01.500000000Z tail")]
    reads = [messages[:2], messages]
    reader = _LogReader(lambda since, follow: iter([reads.pop(0)]), None)
    first = lines_read(reader, follow=True)
    assert [c.text for c in first] == ["before"] and reader.awaits_more()
    assert lines_read(reader, follow=False) == [] and not reader.awaits_more()
    (line,) = reader.flush()
    assert (line.stream, line.time, line.text) == ("stderr", "2026-01-01T00:00:02.000000000Z", "a" * ENGINE_PART_BYTES + "tail")


def test_a_resumed_read_skips_what_was_copied_before():
    messages = [(1, b"2026-01-01T00:00:01.000000000Z old\n"), (1, b"2026-01-01T00:00:02.000000000Z new\n")]
    from aiptrain.logs import parse_engine_time

    reader = _LogReader(lambda since, follow: iter([messages[:1], messages[1:]]),
                        parse_engine_time("2026-01-01T00:00:01Z"))
    assert [c.text for c in lines_read(reader, follow=True)] == ["new"] and not reader.awaits_more()


FRAMES = [(1, b"2026-01-01T00:00:01.000000000Z one\n"), (2, b"2026-01-01T00:00:02Z " + "é\r\n".encode() * 3),
          (1, b"2026-01-01T00:00:03Z " + b"x" * 300), (1, b"2026-01-01T00:00:04Z last\n")]


def engine_body(frames) -> bytes:
    """What the engine sends: each frame (header, payload) as an HTTP chunk of its own, then the last chunk."""
    chunks = [struct.pack(">BxxxL", stream, len(data)) + data for stream, data in frames]
    return b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks) + b"0\r\n\r\n"


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 8, 9, 13, 64, 1000, 1 << 20])
def test_frames_come_whole_however_the_socket_cuts_the_body(piece):
    body = engine_body(FRAMES) + b"the next response on the connection: never read"
    sent = [body[i:i + piece] for i in range(0, len(body), piece)]
    received = frame_blocks(unchunk(lambda: sent.pop(0) if sent else b""))
    assert [frame for block in received for frame in block] == FRAMES
    assert sent == [] or b"never read" in b"".join(sent)


def test_a_body_cut_off_ends_the_frames():
    body = engine_body(FRAMES)
    sent = [body[:-40]]
    received = [frame for block in frame_blocks(unchunk(lambda: sent.pop(0) if sent else b"")) for frame in block]
    assert received == FRAMES[:3]


def lines_read(reader, follow: bool) -> list:
    """The reader's batches of lines, one after another."""
    return [chunk for batch in reader.read(follow) for chunk in batch]

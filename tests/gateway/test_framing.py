"""Framing: where each request's head and body end in a connection's bytes,
whatever the app reads, as the HTTP parsers find them.

Each framing is fed whole and split at every byte, so that what it finds
never depends on how the bytes came in reads."""

from __future__ import annotations

import pytest

from vsqs._gateway.timeouts import Framing, HeadTooLarge

HEAD = b"POST /queues/q/messages HTTP/1.1\r\nHost: localhost\r\n"
NEXT = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


def _feeds(stream: bytes) -> list[list[bytes]]:
    """``stream`` whole, byte by byte, and cut in two at every position."""
    cuts = [[stream], [stream[i : i + 1] for i in range(len(stream))]]
    return cuts + [[stream[:i], stream[i:]] for i in range(1, len(stream))]


def _heads(reads: list[bytes], max_head: int = 16384) -> tuple[int, Framing]:
    framing = Framing(max_head)
    return sum(framing.feed(read) for read in reads), framing


@pytest.mark.parametrize("body", [b"", b"x", b"\r\n\r\nGET / HTTP/1.1\r\n\r\n" * 3])
def test_a_body_of_its_content_length_is_no_head(body: bytes) -> None:
    stream = HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body + NEXT
    for reads in _feeds(stream):
        heads, framing = _heads(reads)
        assert heads == 2
        assert not framing.in_head and not framing.opaque


def test_a_chunked_body_ends_after_its_last_chunk_and_trailers() -> None:
    body = b"5;name=value\r\nhello\r\n0A\r\n" + b"\r\n" * 5 + b"\r\n0\r\nChecksum: 1\r\nMore: 2\r\n\r\n"
    stream = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + body + NEXT
    for reads in _feeds(stream):
        heads, framing = _heads(reads)
        assert heads == 2
        assert not framing.in_head and not framing.opaque


def test_chunked_framing_outranks_a_content_length() -> None:
    stream = HEAD + b"Content-Length: 1000\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" + NEXT
    assert _heads([stream])[0] == 2


def test_only_a_header_line_names_the_framing() -> None:
    stream = HEAD + b"X-Note: content-length: 5\r\n\r\n" + NEXT
    assert _heads([stream])[0] == 2


def test_bare_line_feeds_end_a_head() -> None:
    assert _heads([b"GET / HTTP/1.1\nHost: x\n\n" + NEXT])[0] == 2


def test_a_large_body_is_never_measured_as_a_head() -> None:
    framing = Framing(100)
    framing.feed(HEAD + b"Content-Length: 10000000\r\n\r\n")
    for _ in range(10_000_000 // 65536):
        assert framing.feed(b"\r\n\r\n" * 16384) == 0
    assert framing.feed(b"x" * (10_000_000 % 65536) + NEXT) == 1


@pytest.mark.parametrize("reads", [1, 2])
def test_a_head_is_bounded_to_the_byte(reads: int) -> None:
    head = b"GET / HTTP/1.1\r\nX: " + b"p" * 100 + b"\r\n\r\n"
    parts = [head] if reads == 1 else [head[:50], head[50:]]
    assert _heads(parts, max_head=len(head))[0] == 1
    with pytest.raises(HeadTooLarge):
        _heads(parts, max_head=len(head) - 1)


def test_a_head_that_never_ends_is_refused_at_its_bound() -> None:
    framing = Framing(1000)
    framing.feed(b"GET / HTTP/1.1\r\n")
    with pytest.raises(HeadTooLarge):
        for _ in range(100):
            framing.feed(b"X-Padding: " + b"p" * 50 + b"\r\n")
    assert framing.in_head


def test_blank_lines_before_a_request_line_are_measured_and_end_no_head() -> None:
    framing = Framing(1000)
    assert framing.feed(b"\r\n" * 400) == 0
    assert framing.in_head
    with pytest.raises(HeadTooLarge):
        framing.feed(b"\r\n" * 101)
    assert _heads([b"\r\n\r\n" + NEXT])[0] == 1


def test_pipelined_heads_are_each_bounded() -> None:
    small = b"GET / HTTP/1.1\r\n\r\n"
    assert _heads([small * 50], max_head=len(small))[0] == 50
    with pytest.raises(HeadTooLarge):
        _heads([small * 5 + b"GET / HTTP/1.1\r\nX: 1\r\n\r\n"], max_head=len(small))


def test_trailers_are_bounded_as_a_head() -> None:
    framing = Framing(1000)
    framing.feed(HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\n")
    with pytest.raises(HeadTooLarge):
        for _ in range(100):
            framing.feed(b"T: " + b"t" * 50 + b"\r\n")


@pytest.mark.parametrize("framing_header", [
    b"Transfer-Encoding: gzip", b"Content-Length: abc", b"Content-Length: 5, 6", b"Content-Length: -1",
    b"Content-Length: 123456789012345678901", b"Transfer-Encoding: chunked, gzip",
])
def test_a_framing_the_parsers_refuse_is_opaque(framing_header: bytes) -> None:
    framing = Framing(100)
    assert framing.feed(HEAD + framing_header + b"\r\n\r\n") == 1
    assert framing.opaque
    assert framing.feed(b"p" * 1000 + NEXT) == 0  # nothing more is taken, or refused


@pytest.mark.parametrize("chunk_line", [b"zz\r\n", b"12345678901234567\r\n", b"0x5\r\n"])
def test_a_chunk_size_line_the_parsers_refuse_is_opaque(chunk_line: bytes) -> None:
    framing = Framing(100)
    framing.feed(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunk_line)
    assert framing.opaque


def test_a_repeated_equal_content_length_frames_the_body() -> None:
    stream = HEAD + b"Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc" + NEXT
    assert _heads([stream])[0] == 2


def test_leading_zeros_are_no_digits() -> None:
    stream = (HEAD + b"Content-Length: 0000000000000000000003\r\n\r\nabc" + HEAD
              + b"Transfer-Encoding: chunked\r\n\r\n00000000000000000003\r\nabc\r\n00000000000000000000\r\n\r\n" + NEXT)
    for reads in _feeds(stream)[:2]:
        heads, framing = _heads(reads)
        assert heads == 3
        assert not framing.opaque


def test_a_chunk_size_line_is_bounded_as_a_head() -> None:
    stream = HEAD + b"Transfer-Encoding: chunked\r\n\r\n3;" + b"e" * 900 + b"\r\nabc\r\n0\r\n\r\n" + NEXT
    assert _heads([stream], max_head=1000)[0] == 2
    framing = Framing(1000)
    framing.feed(HEAD + b"Transfer-Encoding: chunked\r\n\r\n3;")
    with pytest.raises(HeadTooLarge):
        for _ in range(100):
            framing.feed(b"e" * 50)
    with pytest.raises(HeadTooLarge):
        _heads([HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"0" * 500 + b"3\r\nabc\r\n"])


@pytest.mark.parametrize("connection", [b"Upgrade", b"keep-alive, upgrade"])
def test_an_upgrade_request_ends_at_its_head(connection: bytes) -> None:
    """As llhttp reads it: what follows an upgrade request's head is a new request, bounded as one."""
    stream = HEAD + b"Connection: " + connection + b"\r\nUpgrade: h2c\r\nContent-Length: 100000\r\n\r\n" + NEXT
    assert _heads([stream])[0] == 2
    framing = Framing(1000)
    framing.feed(HEAD + b"Connection: " + connection + b"\r\nUpgrade: h2c\r\nContent-Length: 100000\r\n\r\n")
    with pytest.raises(HeadTooLarge):
        framing.feed(b"X" * 1001)


def test_an_upgrade_header_alone_leaves_the_body_framed() -> None:
    stream = HEAD + b"Upgrade: h2c\r\nContent-Length: 3\r\n\r\nabc" + NEXT
    assert _heads([stream])[0] == 2


def test_a_content_length_list_of_one_value_frames_the_body() -> None:
    assert _heads([HEAD + b"Content-Length: 3, 3\r\n\r\nabc" + NEXT])[0] == 2

"""``envelope``: the header line of a message file marked ``-e`` (pure)."""

from __future__ import annotations

import errno

import pytest

from vsqs._core import format as _format
from vsqs._core.envelope import decode_content, decode_envelope, encode_envelope
from vsqs._core.errors import StorageError


def test_an_envelope_is_one_compact_json_line_then_the_body_as_is():
    data = encode_envelope({"group": "g", "attributes": {"b": "2", "a": "1"}}, b"line 1\nline 2\n")
    assert data == b'{"attributes":{"a":"1","b":"2"},"group":"g"}\nline 1\nline 2\n'
    assert decode_envelope(data) == ({"attributes": {"a": "1", "b": "2"}, "group": "g"}, b"line 1\nline 2\n")


def test_an_empty_body_and_non_ascii_round_trip():
    header = {"attributes": {"clé": "välue\n"}}
    assert decode_envelope(encode_envelope(header, b"")) == (header, b"")


@pytest.mark.parametrize(
    ("data", "match"),
    [(b"no newline at all", "no header line"), (b"[1, 2]\nbody", "not a JSON object"), (b"{oops\nbody", None)],
)
def test_what_is_not_an_envelope(data, match):
    with pytest.raises(ValueError, match=match):
        decode_envelope(data)


def test_decode_content_of_a_bare_message_is_its_data():
    name = _format.parse_name(_format.new_key())
    assert decode_content(name, b"{}\nnot a header", "/q/x") == (b"{}\nnot a header", None)


def test_decode_content_of_an_envelope():
    name = _format.parse_name(_format.make_stem(_format.new_key(), envelope=True))
    assert decode_content(name, b'{"group":"g"}\nbody', "/q/x") == (b"body", {"group": "g"})


def test_a_corrupt_envelope_is_an_eio_naming_the_file():
    name = _format.parse_name(_format.make_stem(_format.new_key(), envelope=True))
    with pytest.raises(StorageError, match="corrupt message envelope") as caught:
        decode_content(name, b"garbage", "/q/the-file")
    assert caught.value.errno == errno.EIO and caught.value.filename == "/q/the-file"

"""Arrow record batches of claimed messages, for the streaming read's executors.

Each column is built from its buffers (``pyarrow.Array.from_buffers``: the
offsets and bytes joined, the numbers packed) rather than with
``pyarrow.array``, which imports pandas on its first call wherever pandas is
installed: 0.6 s of CPU in each Python worker that Spark starts, more than
the rest of a micro-batch of thousands of messages. Built this way a batch
also costs less a message, and equals what ``pyarrow.array`` would make
(tests/spark/test_record_batches.py).
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow

from vsqs import Message
from vsqs._core.limits import MAX_HEADER_BYTES

MAX_BATCH_BYTES = 2**31 - 1  # the bytes of one binary or string column (32-bit offsets)
_IN_FLIGHT = b"in_flight"


def record_batches(messages: list[Message], arrow: Any, content: bool) -> Iterator[Any]:
    """``messages`` as record batches of the schema ``arrow`` (a subset of the
    source's columns, in any order); ``content``: the bodies were read (else
    body, group and attributes are null). Usually one batch; more where the
    bodies would pass a column's 2 GiB."""
    if not content or _bytes_at_most(messages) <= MAX_BATCH_BYTES or _bytes(messages) <= MAX_BATCH_BYTES:
        yield _record_batch(messages, arrow, content)
        return
    start = 0
    while start < len(messages):
        end, size = start + 1, _bytes(messages[start : start + 1])
        while end < len(messages) and size + (more := _bytes(messages[end : end + 1])) <= MAX_BATCH_BYTES:
            size += more
            end += 1
        yield _record_batch(messages[start:end], arrow, content)
        start = end


def _bytes_at_most(messages: list[Message]) -> int:
    """A cheaper bound than :func:`_bytes`: a message's attributes come from
    its header line, whose bytes their UTF-8 cannot pass."""
    return sum(len(m.body or b"") for m in messages) + len(messages) * MAX_HEADER_BYTES


def _bytes(messages: list[Message]) -> int:
    """The most ``messages`` add to any one column's bytes (a UTF-8 character is at most 4)."""
    size = sum(len(m.body or b"") for m in messages)
    if any(m.attributes for m in messages):
        size += 4 * sum(len(key) + len(value) for m in messages for key, value in m.attributes.items())
    return size


def _record_batch(messages: list[Message], arrow: Any, content: bool) -> Any:
    count = len(messages)

    def column(name: str, kind: Any) -> Any:
        if name == "id":
            return _strings([m.id.encode() for m in messages], kind)
        if name == "state":
            return _strings(_IN_FLIGHT * count, kind, len(_IN_FLIGHT))
        if name == "receive_count":
            return _numbers("i", [m.receive_count for m in messages], kind)
        if name == "sent_at":
            return _numbers("q", [round(m.sent_at * 1_000_000) for m in messages], kind)
        if name == "priority":
            return _numbers("i", [m.priority for m in messages], kind)
        if not content:
            return pyarrow.nulls(count, kind)
        if name == "body":
            return _nullable([m.body for m in messages], kind)
        if name == "group":
            return _nullable([None if m.group is None else m.group.encode() for m in messages], kind)
        if name == "attributes":
            return _maps([m.attributes for m in messages], kind)
        raise AssertionError(name)  # read_columns let only known columns through

    arrays = [column(field.name, field.type) for field in arrow]
    return pyarrow.RecordBatch.from_arrays(arrays, schema=arrow)


def _offsets(lengths: Iterator[int] | Sequence[int]) -> Any:
    offsets = array("i", [0])
    offsets.extend(itertools.accumulate(lengths))
    return pyarrow.py_buffer(offsets)


def _strings(values: Sequence[bytes] | bytes, kind: Any, width: int = 0) -> Any:
    """A string or binary array of ``values`` (encoded); or, given ``width``,
    of ``values`` cut in pieces of ``width`` bytes."""
    if width:
        count = len(values) // width
        offsets = pyarrow.py_buffer(array("i", range(0, len(values) + 1, width)))
        return pyarrow.Array.from_buffers(kind, count, [None, offsets, pyarrow.py_buffer(values)])
    assert not isinstance(values, bytes)
    return pyarrow.Array.from_buffers(
        kind, len(values), [None, _offsets(map(len, values)), pyarrow.py_buffer(b"".join(values))])


def _nullable(values: list[bytes | None], kind: Any) -> Any:
    """A string or binary array of ``values`` (encoded), None a null."""
    nulls = values.count(None)
    if nulls == len(values):
        return pyarrow.nulls(len(values), kind)
    if not nulls:
        return _strings(values, kind)  # type: ignore[arg-type]  # (no None in it)
    valid = bytearray((len(values) + 7) // 8)
    for index, value in enumerate(values):
        if value is not None:
            valid[index >> 3] |= 1 << (index & 7)
    present = [b"" if value is None else value for value in values]
    return pyarrow.Array.from_buffers(
        kind, len(values), [pyarrow.py_buffer(valid), _offsets(map(len, present)),
                            pyarrow.py_buffer(b"".join(present))], null_count=nulls)


def _numbers(code: str, values: list[int], kind: Any) -> Any:
    return pyarrow.Array.from_buffers(kind, len(values), [None, pyarrow.py_buffer(array(code, values))])


def _maps(maps: list[dict[str, str]], kind: Any) -> Any:
    """A map array of ``maps`` (each may be empty, none null)."""
    keys = [key.encode() for attributes in maps for key in attributes]
    items = [value.encode() for attributes in maps for value in attributes.values()]
    entries = pyarrow.StructArray.from_arrays(
        [_strings(keys, kind.key_type), _strings(items, kind.item_type)],
        fields=[kind.key_field, kind.item_field])
    return pyarrow.Array.from_buffers(kind, len(maps), [None, _offsets(map(len, maps))], children=[entries])

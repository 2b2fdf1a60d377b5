"""The envelope: a message file that holds a header line (JSON: attributes,
group, a staged message's dedup hash) before the body, marked ``-e`` in its
name (see docs/FORMAT.md). Pure: no I/O."""

from __future__ import annotations

import errno
import json
from typing import Any

from vsqs._core import fs as _fs
from vsqs._core.errors import StorageError
from vsqs._core.format import Name
from vsqs._core.limits import MAX_HEADER_BYTES
from vsqs._core.rules import load_json


def encode_envelope(header: dict[str, Any], body: bytes) -> bytes:
    """One line of JSON (the header), a newline, then the body as is."""
    return json.dumps(header, sort_keys=True, separators=(",", ":")).encode() + b"\n" + body


def decode_envelope(data: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, body) of an envelope; ValueError if it is not one."""
    end = data.find(b"\n", 0, MAX_HEADER_BYTES + 1)
    if end < 0:
        raise ValueError(f"no header line within {MAX_HEADER_BYTES} bytes")
    header = load_json(data[:end])  # (ValueError if not JSON, or nested too deep)
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    attributes = header.get("attributes", {})
    if not isinstance(attributes, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in attributes.items()
    ):
        raise ValueError("its attributes are not a mapping of strings to strings")
    for field in ("group", "dedup"):
        if field in header and not isinstance(header[field], str):
            raise ValueError(f"its {field} is not a string")
    return header, data[end + 1 :]


def decode_content(name: Name, data: bytes, where: str) -> tuple[bytes, dict[str, Any] | None]:
    """(body, header) of the content of message file ``name``; a corrupt
    envelope is a :class:`StorageError` (EIO) naming ``where``."""
    if not name.envelope:
        return data, None
    try:
        header, body = decode_envelope(data)
    except ValueError as exc:
        raise StorageError(errno.EIO, f"corrupt message envelope ({exc})", _fs.shown(where)) from None
    return body, header

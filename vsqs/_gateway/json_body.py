"""JSON request bodies, read at a cost bounded before any parsing.

``json.loads`` builds every value of a document, and a small value costs the
server tens of times its few bytes: a 14 MB body of tiny entries became
hundreds of MB. So a body is first judged on its text: :func:`count_values`
counts its values (C-speed scans of its bytes, its strings taken out) and a
body with more than its route allows is refused before it is parsed. What is parsed
is checked the way each face needs and JSON itself does not: no ``NaN`` or
``Infinity``, no number out of range, no nesting deeper than
``MAX_JSON_DEPTH``, UTF-8 only, and no string holding a lone surrogate
(``"\\ud800"`` parses, but is no Unicode text and cannot be stored). Large
bodies are parsed on the thread pool (:func:`parse_json_async`).

A refusal is a :class:`BodyRefused`; each face answers it in its own format.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import anyio.to_thread

from vsqs._gateway.limits import INLINE_JSON_BYTES, MAX_JSON_DEPTH, MAX_JSON_INTEGER_DIGITS

# a JSON string, escapes included (unrolled: linear, no catastrophic backtracking)
_STRING_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_STRUCTURE = (b",", b":", b"[", b"{")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


class BodyRefused(Exception):
    """A body refused before or while it was parsed: ``status`` 400 (not acceptable
    JSON), 413 (more values than the route takes) or 422 (a value no text can
    be: ``where`` is its path)."""

    def __init__(self, status: int, message: str, where: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.status, self.message, self.where = status, message, where

    @property
    def parameter(self) -> str | None:
        """``where`` as the dotted parameter name the faces report (``messages.0.body``)."""
        return ".".join(str(part) for part in self.where) or None


def count_values(data: bytes, limit: int) -> int:
    """The values a JSON text holds, judged on its bytes by C-speed scans: when it
    holds at most ``limit``, an upper bound (one more than its separators,
    plus its arrays and objects: exact for valid JSON but that an empty array
    or object counts two); when it holds more, some count over ``limit``.

    Counted first on the raw text (no copy). Past ``limit``, the strings may
    hold the characters counted: if there are more strings than ``limit``
    (quotes not escaped, by two), that is the answer; else the few strings
    are taken out and the text counted again."""
    raw = 1 + sum(data.count(char) for char in _STRUCTURE)
    if raw <= limit:
        return raw
    strings = (data.count(b'"') - data.count(b'\\"')) // 2  # at least this many (a \\" ends one)
    if strings > limit:
        return strings
    bare = _STRING_RE.sub(b"", data)
    return 1 + sum(bare.count(char) for char in _STRUCTURE)


def _refuse_constant(name: str) -> Any:
    raise BodyRefused(400, f"the body is not valid JSON: {name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BodyRefused(400, f"the body holds a number out of range: {text[:40]}")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INTEGER_DIGITS:
        raise BodyRefused(400, f"the body holds an integer of more than {MAX_JSON_INTEGER_DIGITS} digits")
    return int(text)


def _check_tree(document: Any) -> None:
    """No nesting deeper than MAX_JSON_DEPTH, no lone surrogate in any string (iterative:
    the depth is not yet known to be small)."""
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(document, 0, ())]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, str):
            if _SURROGATE_RE.search(value):
                raise BodyRefused(422, "a string holds a lone surrogate (U+D800..U+DFFF): it is no Unicode text",
                                  where)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth >= MAX_JSON_DEPTH:
            raise BodyRefused(400, f"the body nests arrays and objects deeper than {MAX_JSON_DEPTH}")
        if isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE_RE.search(key):
                    raise BodyRefused(422, "a name holds a lone surrogate (U+D800..U+DFFF): it is no Unicode text",
                                      where)
                stack.append((item, depth + 1, (*where, key)))
        else:
            stack.extend((item, depth + 1, (*where, index)) for index, item in enumerate(value))


def parse_json(data: bytes, max_values: int) -> Any:
    """The document ``data`` holds, judged before it is parsed (at most ``max_values``
    values) and checked after; :class:`BodyRefused` otherwise."""
    values = count_values(data, max_values)
    if values > max_values:
        raise BodyRefused(413, f"the body holds about {values} JSON values; this request takes at most {max_values}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyRefused(400, "the body is not UTF-8 text") from None
    try:
        document = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                              parse_int=_bounded_int)
    except RecursionError:
        raise BodyRefused(400, f"the body nests arrays and objects deeper than {MAX_JSON_DEPTH}") from None
    except json.JSONDecodeError as exc:
        raise BodyRefused(400, f"the body is not valid JSON: {exc.msg} (character {exc.pos})") from None
    except ValueError as exc:  # a number json.loads could not convert
        raise BodyRefused(400, f"the body is not valid JSON: {str(exc)[:100]}") from None
    _check_tree(document)
    return document


async def parse_json_async(data: bytes, max_values: int) -> Any:
    """:func:`parse_json`, on the thread pool when ``data`` is large (a parse of
    megabytes must not hold up the event loop; a small one is cheaper in place)."""
    if len(data) <= INLINE_JSON_BYTES:
        return parse_json(data, max_values)
    return await anyio.to_thread.run_sync(parse_json, data, max_values)

"""The console's forms: a bounded ``application/x-www-form-urlencoded``
body parsed into fields, and the settings form: its rows, one per editable
setting of the engine's schema, and what it holds turned into the changes
the native API would take (validated by the same model,
:class:`~vsqs._gateway.rest.models.QueueSettings`, and then by the engine's
schema)."""

from __future__ import annotations

from typing import Any, NamedTuple
from urllib.parse import parse_qs

import anyio
from fastapi import Request
from pydantic import ValidationError

from vsqs import InvalidArgument
from vsqs._core.settings import SCHEMA, Setting
from vsqs._gateway.errors import ApiError
from vsqs._gateway.rest.models import QueueSettings

FORM_TYPE = "application/x-www-form-urlencoded"
MAX_FORM_BYTES = 256 * 1024  # a test message's body (64 KiB) and its escapes fit
MAX_FIELDS = 64
INLINE_FORM_BYTES = 16 * 1024  # a form parsed on the event loop; a larger one on a thread
MAX_TEST_BODY = 64 * 1024  # characters of a test message published from the console


class SettingField(NamedTuple):
    """A row of the queue page's settings form."""

    name: str
    checkbox: bool  # a flag; else a text field
    inputmode: str  # the keyboard a phone shows: "decimal" for numbers
    placeholder: str  # what an empty field says


def _field(name: str, setting: Setting) -> SettingField:
    # a flag's checkbox has no third state: an unchecked box saves false (an editable
    # flag has a default of true or false: tests/console/test_pages.py holds them to it)
    numeric = setting.kind in ("seconds", "count")
    return SettingField(name, setting.kind == "flag", "decimal" if numeric else "text",
                        "N/seconds" if setting.kind == "throttle" else "unset")


# the settings the queue page edits: the editable ones (suspended has its own buttons), in the
# schema's order but for the timings a client leaves to the queue, shown first
_FIRST = ("visibility_timeout", "delay", "receive_wait")
FIELDS = tuple(_field(name, setting) for name, setting in sorted(
    SCHEMA.items(), key=lambda item: _FIRST.index(item[0]) if item[0] in _FIRST else len(_FIRST))
    if setting.editable and setting.kind != "operations")


async def read_form(request: Request) -> dict[str, str]:
    """The fields of a form POST (the last value of a repeated one); 415 for
    another content type, 413 past MAX_FORM_BYTES, 400 for a body that is no form."""
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type != FORM_TYPE:
        raise ApiError(415, "unsupported_media_type", f"the console takes {FORM_TYPE}")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise ApiError(413, "request_too_large", f"a console form is at most {MAX_FORM_BYTES} bytes")
    if len(body) > INLINE_FORM_BYTES:  # (parsing 256 KiB of escapes takes a tenth of a second)
        return await anyio.to_thread.run_sync(_fields, body)
    return _fields(body)


def _fields(body: bytes) -> dict[str, str]:
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                          max_num_fields=MAX_FIELDS)
    except (UnicodeDecodeError, ValueError):
        raise ApiError(400, "bad_request", "the form does not parse") from None
    return {name: values[-1] for name, values in fields.items()}


def settings_changes(form: dict[str, str], current: dict[str, Any]) -> dict[str, Any]:
    """The settings the form changes (an empty field unsets one), validated as
    the API validates a PATCH; InvalidArgument naming the first bad field."""
    given: dict[str, Any] = {}
    for field in FIELDS:
        name = field.name
        if field.checkbox:
            given[name] = form.get(name) == "on"
            continue
        if name not in form:
            continue
        text = form[name].strip()
        if SCHEMA[name].kind == "throttle" and text:
            parts = text.replace("/", " ").replace(",", " ").split()
            given[name] = parts if len(parts) == 2 else text
        else:
            given[name] = text or None
    try:
        changes = QueueSettings.model_validate(given).changes()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())[:1]) or "settings"
        raise InvalidArgument(f"{where}: {first.get('msg', 'invalid')}") from None
    except ApiError as exc:
        raise InvalidArgument(exc.message) from None
    return {name: value for name, value in changes.items() if _differs(value, current.get(name))}


def _differs(new: Any, old: Any) -> bool:
    if isinstance(new, (tuple, list)) and isinstance(old, (tuple, list)):
        return [float(v) for v in new] != [float(v) for v in old]
    if isinstance(new, (int, float)) and isinstance(old, (int, float)) and not isinstance(new, bool):
        return float(new) != float(old)
    return bool(new != old)


def setting_text(name: str, value: Any) -> str:
    """A setting's value as its form field shows it ("" when unset)."""
    return "" if value is None else SCHEMA[name].text(value)

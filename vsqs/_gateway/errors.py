"""Errors as the native face answers them: :class:`ApiError`, the one
translation of vsqs errors to HTTP statuses, and the JSON error body."""

from __future__ import annotations

import os
from typing import Any

from fastapi.responses import JSONResponse

from vsqs import (
    IncompatibleFormat,
    InvalidArgument,
    InvalidReceipt,
    MessageTooLarge,
    QueueFull,
    QueueNotFound,
    QueueSuspended,
    StaleReceipt,
    StorageError,
    VsqsError,
)


class ApiError(Exception):
    """An HTTP answer raised from a handler: status, a short code and a message
    (naming the parameter at fault when there is one)."""

    def __init__(self, status: int, code: str, message: str, parameter: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.parameter = status, code, message, parameter
        self.headers = headers or {}


def api_error_of(exc: VsqsError) -> ApiError:
    """The one translation of vsqs errors to HTTP statuses (the native face)."""
    text = str(exc)
    if isinstance(exc, QueueNotFound):
        return ApiError(404, "queue_not_found", text, "queue")
    if isinstance(exc, InvalidReceipt):
        return ApiError(400, "invalid_receipt", text, "receipt")
    if isinstance(exc, StaleReceipt):
        return ApiError(409, "stale_receipt", text, "receipt")
    if isinstance(exc, MessageTooLarge):
        return ApiError(413, "message_too_large", text, "body")
    if isinstance(exc, QueueFull):
        return ApiError(429, "queue_full", text, headers={"Retry-After": "1"})
    if isinstance(exc, QueueSuspended):
        return ApiError(503, "queue_suspended", text, headers={"Retry-After": "5"})
    if isinstance(exc, InvalidArgument):
        return ApiError(422, "invalid_argument", text, _named_parameter(text))
    if isinstance(exc, IncompatibleFormat):
        return ApiError(409, "incompatible_format", text)
    if isinstance(exc, StorageError):
        if exc.errno == 28:  # ENOSPC
            return ApiError(507, "storage_full", text)
        return ApiError(503, "storage_error", text, headers={"Retry-After": "5"})
    return ApiError(500, "error", text)


def without_paths(text: str, spool_root: str) -> str:
    """An error message fit for a client: paths in the spool become queue names,
    and the spool's own path goes (a client has no business knowing it)."""
    root = spool_root.rstrip(os.sep)
    return text.replace(root + os.sep, "").replace(f" in {root}", "").replace(root, "the spool")


def _named_parameter(text: str) -> str | None:
    """vsqs's InvalidArgument messages start with the argument's name ("visibility_timeout must ...")."""
    head = text.split(" ", 1)[0].rstrip(":")
    return head if head.isidentifier() else None


def error_response(error: ApiError) -> JSONResponse:
    doc: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.parameter:
        doc["parameter"] = error.parameter
    return JSONResponse({"error": doc}, status_code=error.status, headers=error.headers)

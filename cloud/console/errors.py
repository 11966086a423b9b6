"""Errors to HTTP: hub errors become 4xx ``{"error": message}``; nothing else leaks.

:class:`~cloud.errors.ValidationError` 400 (FastAPI's own schema errors stay 422,
in the same shape), :class:`~cloud.errors.NotFoundError` 404,
:class:`~cloud.errors.ConflictError` 409, :class:`~cloud.errors.PermissionDeniedError`
403, :class:`~cloud.errors.AuthError` 401. Any other failure is logged and answered
500 with a fixed message: no traceback, no SQL, no path reaches the client
(:mod:`cloud.console.guard` catches what no handler here does).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from cloud.errors import (
    AuthError,
    ConflictError,
    HubError,
    NotFoundError,
    PermissionDeniedError,
    ValidationError,
)

__all__ = ["INTERNAL_ERROR", "error_response", "install_error_handlers", "status_of"]

_log = logging.getLogger(__name__)

#: What a client reads when the hub failed in a way that is not its fault.
INTERNAL_ERROR = "internal error: the hub failed to answer; see the hub's log"
#: Longest error message sent; a longer one is cut.
MAX_MESSAGE_CHARS = 1000

_STATUS: tuple[tuple[type[HubError], int], ...] = (
    (AuthError, 401),
    (PermissionDeniedError, 403),
    (NotFoundError, 404),
    (ConflictError, 409),
    (ValidationError, 400),
)


def status_of(exc: HubError) -> int | None:
    """The 4xx status of a hub error that is the caller's fault; None for the hub's own."""
    return next((code for kind, code in _STATUS if isinstance(exc, kind)), None)


def error_response(status: int, message: str, **extra: object) -> JSONResponse:
    """The JSON error body every failure is answered with."""
    text = message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS] + "…"
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": text, **extra}, status_code=status, headers=headers)


async def _hub_error(_request: Request, exc: Exception) -> JSONResponse:
    status = status_of(exc) if isinstance(exc, HubError) else None
    if status is None:
        _log.error("console request failed: %s", exc, exc_info=exc)
        return error_response(500, INTERNAL_ERROR)
    return error_response(status, str(exc) or type(exc).__name__)


async def _schema_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))}
        for e in exc.errors()[:20]
    ]
    first = problems[0] if problems else {"loc": [], "msg": "malformed request"}
    where = ".".join(first["loc"]) if isinstance(first["loc"], list) else ""
    return error_response(422, f"bad request: {where}: {first['msg']}", detail=problems)


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    response = error_response(exc.status_code, str(exc.detail))
    for key, value in (exc.headers or {}).items():
        response.headers[key] = value
    return response


def install_error_handlers(app: FastAPI) -> None:
    """Answer every failure of ``app`` with a JSON ``{"error": ...}`` body."""
    app.add_exception_handler(HubError, _hub_error)
    app.add_exception_handler(RequestValidationError, _schema_error)
    app.add_exception_handler(HTTPException, _http_error)

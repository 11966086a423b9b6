"""The outermost layer of the console app: body caps, a last-resort 500, safe headers.

A plain ASGI middleware (no buffering of responses, so server-sent events
stream through it): a request body over the cap is refused with 413 before a
route sees it, whether its length was declared or not (bodies are small, so the
guard reads the whole body first and hands it on); any exception nothing else
handled is logged once and answered 500 with a fixed message.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from cloud.console.errors import INTERNAL_ERROR

__all__ = ["MAX_BODY_BYTES", "Guard"]

_log = logging.getLogger(__name__)

#: Largest request body the API reads.
MAX_BODY_BYTES = 64 * 1024

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]


async def _answer(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers + _HEADERS})
    await send({"type": "http.response.body", "body": body})


def _declared_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return -1
    return None


class Guard:
    """Wraps the console app (see the module's docstring)."""

    def __init__(self, app: ASGIApp, *, max_body: int = MAX_BODY_BYTES) -> None:
        """Guard ``app``; bodies over ``max_body`` bytes are refused with 413."""
        self._app = app
        self._max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request (or pass a lifespan or websocket scope through)."""
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and not 0 <= declared <= self._max_body:
            await _answer(send, 413, f"request body over {self._max_body} bytes")
            return
        body = await self._read_body(receive)
        if body is None:
            await _answer(send, 413, f"request body over {self._max_body} bytes")
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        started = False

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        try:
            await self._app(scope, replay, guarded_send)
        except Exception as exc:
            _log.error("console request failed: %s", exc, exc_info=exc)
            if not started:
                await _answer(send, 500, INTERNAL_ERROR)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole request body; None when it is over the cap (or the client left)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

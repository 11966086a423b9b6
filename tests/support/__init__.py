"""Helpers the tests share.

Tests wait for conditions, never for a fixed time: :func:`wait_until` and
:func:`async_wait_until` poll a check until it holds or a deadline passes.
The process helpers are the ones the demo uses (:mod:`edgeskill.processes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from edgeskill.processes import Fleet, agent_args, wait_for_port, wait_until
from tests.support.ports import free_port

__all__ = [
    "Fleet",
    "agent_args",
    "async_wait_until",
    "free_port",
    "in_background",
    "wait_for_port",
    "wait_until",
]


@contextlib.asynccontextmanager
async def in_background(work: Awaitable[Any]) -> AsyncIterator[asyncio.Future[Any]]:
    """Run ``work`` as a task for the block; cancel it and wait for its end afterwards."""
    task = asyncio.ensure_future(work)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def async_wait_until(
    check: Callable[[], bool | Awaitable[bool]],
    timeout_s: float,
    what: str,
    interval_s: float = 0.02,
) -> None:
    """Poll ``check`` (a function or coroutine function) on the event loop until it holds.

    Raises:
        TimeoutError: it did not hold within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        await asyncio.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.1f} s waiting for {what}")

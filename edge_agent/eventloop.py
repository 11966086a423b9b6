"""The event loop agents, simulator workers and hub processes run on.

The standard asyncio loop, or uvloop (libuv under asyncio's API) where
``EDGESKILL_EVENT_LOOP=uvloop`` asks for it and the ``fast`` extra installed
it. A simulated fleet of thousands of agents a process spends much of its time
in the event loop's own bookkeeping (timers, ready callbacks, socket
readiness), and so does a hub serving them; at 2,000 simulated devices in one
process uvloop took 3-10% off the agents' CPU and 11-14% off the hub's. It is
not the default: the agent's sandboxed skill processes, signals and transports
are tested on the standard loop.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["ENV", "Wake", "loop_factory", "loop_name", "run"]

#: The environment variable that chooses the loop: ``asyncio`` (the default) or ``uvloop``.
ENV = "EDGESKILL_EVENT_LOOP"

T = TypeVar("T")


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


class Wake:
    """A flag a loop sleeps on, as :class:`asyncio.Event`, with a wait that may time out.

    An agent's loops (reconcile, heartbeat, outbox flush, workload) each sleep
    until woken or a period passed. ``asyncio.timeout`` around ``Event.wait``
    ends such a sleep by cancelling the task and turning the cancellation into
    a ``TimeoutError``: an exception raised and caught three times, most of the
    cost of a quiet wake (8.8 against 2.3 µs on uvloop, 11.6 against 6.2 on the
    standard loop), and thousands a second in a simulated fleet. Here the
    timer resolves the waiter's future instead, and a cancelled wait is cancelled
    as any other await. Use it from the loop's thread only, as ``asyncio.Event``.
    """

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        """A flag that is not set."""
        self._set = False
        self._waiters: list[asyncio.Future[bool]] = []

    def is_set(self) -> bool:
        """Whether the flag is set."""
        return self._set

    def set(self) -> None:
        """Set the flag and wake every waiter."""
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(True)

    def clear(self) -> None:
        """Clear the flag; waits from now on sleep until it is set again."""
        self._set = False

    async def wait(self, timeout_s: float | None = None) -> bool:
        """Sleep until the flag is set or ``timeout_s`` passed (None: no limit).

        Returns:
            True when woken by :meth:`set` (or set already), False when the time ran out.
        """
        if self._set:
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(waiter)
        timer = None if timeout_s is None else loop.call_later(max(0.0, timeout_s), _expire, waiter)
        try:
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()
            if waiter in self._waiters:  # timed out or cancelled: set() did not take it
                self._waiters.remove(waiter)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory when ``EDGESKILL_EVENT_LOOP`` asks for it, else None.

    Raises:
        ValueError: ``EDGESKILL_EVENT_LOOP`` names neither loop, or asks for
            uvloop where it is not installed.
    """
    wanted = os.environ.get(ENV, "").strip().lower()
    if wanted not in ("", "uvloop", "asyncio"):
        raise ValueError(f"{ENV}={wanted!r}: use uvloop or asyncio")
    if wanted != "uvloop":
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        raise ValueError(
            f"{ENV}=uvloop, but uvloop is not installed (pip install 'edgeskill[fast]')"
        ) from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop :func:`run` would use now."""
    return "asyncio" if loop_factory() is None else "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on a new loop of :func:`loop_factory`'s kind, and close it.

    Raises:
        ValueError: ``EDGESKILL_EVENT_LOOP`` is not a loop this host can run.
    """
    try:
        factory = loop_factory()
    except ValueError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)

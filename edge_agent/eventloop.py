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

__all__ = ["ENV", "loop_factory", "loop_name", "run"]

#: The environment variable that chooses the loop: ``asyncio`` (the default) or ``uvloop``.
ENV = "EDGESKILL_EVENT_LOOP"

T = TypeVar("T")


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

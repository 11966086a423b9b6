"""The control-loop host: named background loops of a hub process, restarted when they fail.

A hub process runs a few long-lived coroutines beside its servers: the
desired-state change notifier, telemetry flushing, the TUF timestamp refresh,
and later the rollout engine and drift policies. Each is registered here under
a name. Every-process loops run as long as the host runs; leader-only loops run
only while this process is the fleet's leader (see :mod:`cloud.leader`) and
are cancelled the moment it steps down.

A loop that raises (or returns, which a loop should never do) is logged once
with its name, counted, and started again after an exponential backoff. The
backoff is capped, and resets once a loop has run fine for a while, so a loop
that fails once a day restarts quickly each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

__all__ = ["Backoff", "LoopFactory", "LoopHost", "LoopState", "periodic"]

log = logging.getLogger(__name__)

#: A coroutine function that runs one loop until it is cancelled.
LoopFactory = Callable[[], Awaitable[None]]

#: Most loops one host takes; names are the hub's own, so this only guards against a bug.
MAX_LOOPS = 64


@dataclass(frozen=True)
class Backoff:
    """How long to wait before restarting a failed loop.

    The first restart waits ``initial_s``; each further failure multiplies the
    wait by ``factor`` up to ``cap_s``. A run that lasted ``reset_after_s`` or
    more before failing starts the series again at ``initial_s``.
    """

    initial_s: float = 0.5
    cap_s: float = 30.0
    factor: float = 2.0
    reset_after_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 <= self.initial_s <= self.cap_s or self.factor < 1 or self.reset_after_s < 0:
            raise ValueError(f"inconsistent backoff {self}")

    def next_delay(self, delay_s: float) -> float:
        """The wait after one that lasted ``delay_s``."""
        return min(max(delay_s * self.factor, self.initial_s), self.cap_s)


@dataclass(frozen=True)
class LoopState:
    """What one loop is doing, for metrics and logs (a snapshot; it does not change)."""

    name: str
    leader_only: bool
    running: bool = False
    failures: int = 0
    restarts: int = 0
    last_error: str = ""


@dataclass
class _Loop:
    factory: LoopFactory
    state: LoopState
    task: asyncio.Task[None] | None = None


def periodic(
    step: Callable[[], Awaitable[None]], interval_s: float, *, first_now: bool = False
) -> LoopFactory:
    """A loop factory that awaits ``step`` every ``interval_s`` seconds.

    Args:
        step: one round of work; an exception ends the loop (the host restarts it).
        interval_s: the pause between the end of one round and the start of the next.
        first_now: run the first round at once instead of after one interval.

    Raises:
        ValueError: ``interval_s`` is not positive.
    """
    if interval_s <= 0:
        raise ValueError(f"a periodic loop needs a positive interval, not {interval_s}")

    async def run() -> None:
        if not first_now:
            await asyncio.sleep(interval_s)
        while True:
            await step()
            await asyncio.sleep(interval_s)

    return run


class LoopHost:
    """Runs named loops on the running event loop and restarts them when they fail.

    Use it from one event loop: :meth:`add` every loop, :meth:`start`, call
    :meth:`set_leader` as leadership comes and goes, and :meth:`stop` at the end.
    """

    def __init__(
        self,
        *,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._backoff = backoff or Backoff()
        self._clock = clock
        self._sleep = sleep
        self._loops: dict[str, _Loop] = {}
        self._started = False
        self._leader = False

    @property
    def is_leader(self) -> bool:
        """Whether this process leads now (and runs the leader-only loops)."""
        return self._leader

    def add(self, name: str, factory: LoopFactory, *, leader_only: bool = False) -> None:
        """Register a loop; it starts with :meth:`start` (or on election when ``leader_only``).

        Raises:
            ValueError: the name is empty or taken, too many loops, or the host already started.
        """
        if self._started:
            raise ValueError(f"cannot add loop {name!r}: the host has started")
        if not name or name in self._loops:
            raise ValueError(f"loop name {name!r} is empty or taken")
        if len(self._loops) >= MAX_LOOPS:
            raise ValueError(f"a host runs at most {MAX_LOOPS} loops")
        self._loops[name] = _Loop(factory, LoopState(name, leader_only))

    def states(self) -> list[LoopState]:
        """Every loop's state, sorted by name; safe to call from another thread."""
        return sorted((loop.state for loop in tuple(self._loops.values())), key=lambda s: s.name)

    def start(self) -> None:
        """Start every every-process loop (and the leader-only ones if already leader).

        Raises:
            RuntimeError: no running event loop, or started twice.
        """
        if self._started:
            raise RuntimeError("the loop host has started already")
        self._started = True
        self._launch(lambda loop: not loop.state.leader_only or self._leader)

    async def set_leader(self, leader: bool) -> None:
        """Start the leader-only loops on election; cancel them (and wait) on losing it."""
        if leader == self._leader:
            return
        self._leader = leader
        if leader:
            log.info("became leader")
            if self._started:
                self._launch(lambda loop: loop.state.leader_only)
            return
        log.warning("lost leadership; stopping the leader-only loops")
        await self._cancel([loop for loop in self._loops.values() if loop.state.leader_only])

    async def stop(self) -> None:
        """Cancel every loop and wait for them to end."""
        self._leader = False
        await self._cancel(list(self._loops.values()))

    def _launch(self, which: Callable[[_Loop], bool]) -> None:
        for name, loop in self._loops.items():
            if which(loop) and (loop.task is None or loop.task.done()):
                loop.task = asyncio.create_task(self._supervise(loop), name=f"loop:{name}")

    async def _cancel(self, loops: list[_Loop]) -> None:
        tasks = [loop.task for loop in loops if loop.task is not None]
        for loop in loops:
            loop.task = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _supervise(self, loop: _Loop) -> None:
        delay = self._backoff.initial_s
        while True:
            began = self._clock()
            error = await self._run_once(loop)
            if self._clock() - began >= self._backoff.reset_after_s:
                delay = self._backoff.initial_s
            words = "returned (a loop must run until cancelled)"
            if error is not None:
                words = f"{type(error).__name__}: {error}"
            state = loop.state
            loop.state = replace(state, failures=state.failures + 1, last_error=words)
            log.error(
                "loop %s failed: %s; restarting in %.1f s",
                state.name,
                words,
                delay,
                exc_info=error,
            )
            await self._sleep(delay)
            loop.state = replace(loop.state, restarts=loop.state.restarts + 1)
            delay = self._backoff.next_delay(delay)

    async def _run_once(self, loop: _Loop) -> Exception | None:
        """Run the loop until it ends: the exception it raised, or None if it returned."""
        loop.state = replace(loop.state, running=True)
        try:
            await loop.factory()
        except Exception as exc:  # any failure of a loop is the host's to handle
            return exc
        finally:
            loop.state = replace(loop.state, running=False)
        return None

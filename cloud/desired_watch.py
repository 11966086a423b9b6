"""The hub process's one desired-state change notifier, shared by both transport servers.

One poll of ``desired_generations`` per interval covers the whole fleet. Given
a fingerprint (a few counts and sums, :meth:`StateTables.desired_fingerprint`),
the notifier asks it first and reads the fleet only when it moved, or when
``full_every_s`` passed since the last full read (changes that cancel out in the
fingerprint, and a director's instructions due for renewal, wait at most that).
Polling the store, rather than passing events inside one process, keeps hub
processes stateless: a deployment made through any hub process or the CLI
reaches every device, whichever process holds its connection.

Two kinds of listener share each poll: a per-device event (a gRPC stream
waits for its device) and fleet snapshots (the MQTT server publishes every
changed device's retained desired state). :meth:`DesiredNotifier.run` is the
loop; the hub's control-loop host runs it, or :func:`cloud.hubcore.running`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncGenerator, Callable, Mapping

from cloud.errors import StoreError

__all__ = ["DesiredNotifier"]

log = logging.getLogger(__name__)

Poll = Callable[[], Mapping[str, int]]
Fingerprint = Callable[[], object]


class DesiredNotifier:
    """Wakes listeners when desired generations change.

    Args:
        poll: returns every registered device's desired generation (one store
            query; called in a worker thread).
        interval_s: time between polls.
        fingerprint: a cheap value that changes when ``poll``'s answer may have
            (called in a worker thread); None to read the fleet every poll.
        full_every_s: with a fingerprint, the longest time between full reads.
    """

    def __init__(
        self,
        poll: Poll,
        interval_s: float = 0.5,
        *,
        fingerprint: Fingerprint | None = None,
        full_every_s: float = 5.0,
    ) -> None:
        self._poll = poll
        self.interval_s = interval_s
        self._fingerprint = fingerprint
        self.full_every_s = full_every_s
        self._last_print: object = None
        self._last_full = -math.inf
        self._events: dict[str, set[asyncio.Event]] = {}
        self._seen: dict[str, int] = {}
        # Subscribed since the last poll: woken once after it, so that a change between
        # a device's register and that poll is not missed.
        self._fresh: set[str] = set()
        self._snapshot_events: set[asyncio.Event] = set()
        #: The generations of the latest successful poll.
        self.latest: dict[str, int] = {}
        #: Successful polls so far; failed polls are counted in ``failures``.
        self.polls = 0
        self.failures = 0
        #: Of the successful polls, those that read the whole fleet.
        self.full_reads = 0
        self._nudged = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def nudge(self) -> None:
        """Poll now rather than at the end of the interval (callable from any thread).

        The leader calls it after a rollout pass wrote desired state: a device it
        admitted then hears of it at once instead of after half an interval.
        """
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._nudged.set)

    def subscribe(self, device_id: str) -> asyncio.Event:
        """An event set after the next poll, and whenever ``device_id``'s generation changes."""
        event = asyncio.Event()
        self._events.setdefault(device_id, set()).add(event)
        self._fresh.add(device_id)
        return event

    def unsubscribe(self, device_id: str, event: asyncio.Event) -> None:
        """Stop waking ``event``."""
        events = self._events.get(device_id)
        if events is not None:
            events.discard(event)
            if not events:
                del self._events[device_id]

    async def snapshots(self) -> AsyncGenerator[dict[str, int], None]:
        """Yield the fleet's generations after each poll (a slow reader skips to the latest)."""
        ready = asyncio.Event()
        self._snapshot_events.add(ready)
        try:
            while True:
                await ready.wait()
                ready.clear()
                yield dict(self.latest)
        finally:
            self._snapshot_events.discard(ready)

    async def run(self) -> None:
        """Poll forever, ``interval_s`` apart or when nudged; a failed poll is retried."""
        self._loop = asyncio.get_running_loop()
        try:
            while True:
                self._nudged.clear()
                await self.poll_once()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._nudged.wait(), self.interval_s)
        finally:
            self._loop = None

    async def poll_once(self) -> bool:
        """Poll the store once and wake whoever it concerns.

        Returns:
            False when the store failed (logged, and counted in ``failures``).
        """
        fresh, self._fresh = self._fresh, set()
        try:
            # Read before the fleet: a change between the two is then in the fleet read,
            # or moves the next fingerprint.
            mark = await asyncio.to_thread(self._fingerprint) if self._fingerprint else None
            due = time.monotonic() - self._last_full >= self.full_every_s
            if mark is not None and mark == self._last_print and not due:
                self._wake_fresh(fresh)
                self.polls += 1
                return True
            started = time.monotonic()
            generations = dict(await asyncio.to_thread(self._poll))
        except StoreError as exc:
            self.failures += 1
            self._fresh |= fresh  # not woken yet: wake them after a poll that works
            if self.failures == 1 or self.failures % 100 == 0:
                log.warning("polling desired state failed (%d so far): %s", self.failures, exc)
            return False
        for device_id, gen in generations.items():
            if self._seen.get(device_id, gen) != gen or device_id in fresh:
                for event in self._events.get(device_id, ()):
                    event.set()
        self._seen = generations
        self.latest = generations
        self._last_print, self._last_full = mark, started
        self.polls += 1
        self.full_reads += 1
        for ready in self._snapshot_events:
            ready.set()
        return True

    def _wake_fresh(self, fresh: set[str]) -> None:
        """Wake the subscribers new since the last poll (nothing changed for anyone)."""
        for device_id in fresh:
            for event in self._events.get(device_id, ()):
                event.set()

"""One store poll per interval tells every connected device's stream that its desired state changed.

Polling the store, rather than passing events inside one process, keeps hub
processes stateless: a deployment made through any hub process or the CLI
reaches every stream, whichever process holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from cloud.errors import StoreError
from cloud.store import Store

log = logging.getLogger(__name__)


class DesiredWatch:
    """Wakes a per-device event when that device's desired generation changes."""

    def __init__(self, store: Store, interval_s: float = 0.5) -> None:
        self.store = store
        self.interval_s = interval_s
        self._events: dict[str, set[asyncio.Event]] = {}
        self._seen: dict[str, int] = {}
        # Subscribed since the last poll: woken once after it, so that a change between
        # a device's register and that poll is not missed.
        self._fresh: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def subscribe(self, device_id: str) -> asyncio.Event:
        """An event set whenever ``device_id``'s desired generation changes."""
        event = asyncio.Event()
        self._events.setdefault(device_id, set()).add(event)
        self._fresh.add(device_id)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="desired-watch")
        return event

    def unsubscribe(self, device_id: str, event: asyncio.Event) -> None:
        """Stop waking ``event``."""
        events = self._events.get(device_id)
        if events is not None:
            events.discard(event)
            if not events:
                del self._events[device_id]

    async def close(self) -> None:
        """Stop polling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while self._events:
            fresh, self._fresh = self._fresh, set()
            try:
                generations = await asyncio.to_thread(self.store.desired_generations)
            except StoreError as exc:
                log.warning("polling desired state failed: %s", exc)
                generations = {}
            for device_id, gen in generations.items():
                if self._seen.get(device_id, gen) != gen or device_id in fresh:
                    for event in self._events.get(device_id, ()):
                        event.set()
                self._seen[device_id] = gen
            await asyncio.sleep(self.interval_s)

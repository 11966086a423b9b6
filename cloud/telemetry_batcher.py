"""Group commit: many devices' messages in one store transaction (telemetry, reports).

One transaction per message caps ingest at what the database commits per
second. The batcher collects windows from every device that submits at the
same time and writes them together, flushing when a batch is full or when its
oldest item has waited ``linger_s``. A submitter gets its answer only after
the batch holding its window has committed, so the hub still acknowledges
nothing that is not durably stored. When a batch fails, every submitter in it
gets the error: nothing is acknowledged and the agents send again. Windows are
validated once, by the write; only when it refuses a batch as malformed is each
window checked, and the bad ones are refused alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from cloud.errors import StoreError, ValidationError
from cloud.store import TelemetryRecord
from cloud.store.telemetry import TelemetryWindow, record_window

__all__ = [
    "BatcherClosedError",
    "BatcherSettings",
    "GroupCommit",
    "TelemetryBatcher",
    "TelemetryItem",
    "Verdict",
]

#: A window to store, as :meth:`cloud.store.Store.add_telemetry_windows` takes it.
TelemetryItem = TelemetryWindow
#: What the write said of one item: stored (True), a duplicate (False), or why it was refused.
Verdict = bool | ValidationError

MAX_BATCH_ITEMS = 10_000
ItemT = TypeVar("ItemT")


class BatcherClosedError(StoreError):
    """A window was submitted to, or left waiting in, a closed batcher."""


@dataclass(frozen=True)
class BatcherSettings:
    """How the batcher trades latency for throughput.

    Attributes:
        max_items: Items per transaction; a full batch is written at once.
        linger_s: Longest time the oldest waiting item waits for company.
        max_waiting: Submitters allowed to wait at once; more wait for room.
    """

    max_items: int = 256
    linger_s: float = 0.001
    max_waiting: int = 20_000

    def __post_init__(self) -> None:
        """Raises: ValidationError: a setting out of range."""
        if not 1 <= self.max_items <= MAX_BATCH_ITEMS:
            raise ValidationError(f"max_items must be in 1..{MAX_BATCH_ITEMS}")
        if not 0 <= self.linger_s <= 1:
            raise ValidationError("linger_s must be in 0..1 seconds")
        if self.max_waiting < self.max_items:
            raise ValidationError("max_waiting must be at least max_items")


@dataclass
class _Waiting(Generic[ItemT]):
    """One submitter: its items go into the same transaction."""

    items: list[ItemT]
    future: asyncio.Future[list[Verdict]]
    since: float


@dataclass
class _Lane(Generic[ItemT]):
    """Everything bound to one event loop (asyncio primitives cannot change loops)."""

    loop: asyncio.AbstractEventLoop
    #: Items waiting for their batch to commit, and set while that is under the cap.
    inflight: int = 0
    room: asyncio.Event = field(default_factory=asyncio.Event)
    queue: list[_Waiting[ItemT]] = field(default_factory=list)
    #: Items in ``queue``.
    queued: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    full: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class GroupCommit(Generic[ItemT]):
    """Writes items of many devices in shared transactions.

    Used from one event loop at a time; it starts its flusher on first use
    inside the running loop, and starts afresh when used from a new loop (the
    old loop's flusher and waiters ended with that loop).

    Args:
        write: Stores a batch in one transaction and returns, per item, True
            when stored or False when it changed nothing (a duplicate).
            Called in a worker thread.
        check: Raises ``ValidationError`` for an item ``write`` would refuse;
            run on each item of a batch ``write`` refused as malformed, to
            refuse the bad items alone.
        settings: Batch size, linger and caps.
        name: What the items are, for messages and the flusher task's name.
    """

    def __init__(
        self,
        write: Callable[[Sequence[ItemT]], list[bool]],
        check: Callable[[ItemT], None],
        settings: BatcherSettings | None = None,
        *,
        name: str = "items",
    ) -> None:
        self._write = write
        self._check = check
        self.settings = settings or BatcherSettings()
        self.name = name
        self._lane: _Lane[ItemT] | None = None
        self._closed = False
        #: Transactions written and items in them; exported as metrics.
        self.batches = 0
        self.items = 0

    @property
    def waiting(self) -> int:
        """Items submitted and not yet taken into a batch."""
        lane = self._lane
        return 0 if lane is None else lane.queued

    async def submit_item(self, item: ItemT) -> bool:
        """Store one item with the next batch; return once that batch committed.

        Returns:
            What ``write`` said of it: True when stored, False when it changed nothing.

        Raises:
            ValidationError: The item is malformed; the others in its batch are
                stored all the same.
            BatcherClosedError: The batcher is closed.
            StoreError: The batch holding the item failed; nothing of it is stored.
        """
        (verdict,) = await self.submit_many([item])
        if isinstance(verdict, ValidationError):
            raise verdict
        return verdict

    async def submit_many(self, items: list[ItemT]) -> list[Verdict]:
        """Store items in one transaction (shared with others); return once it committed.

        Args:
            items: At most ``settings.max_items``.

        Returns:
            Per item what ``write`` said of it (True stored, False a duplicate), or
            the ValidationError that refused it alone.

        Raises:
            ValidationError: More items than a batch holds.
            BatcherClosedError: The batcher is closed.
            StoreError: The batch holding the items failed; nothing of it is stored.
        """
        if not items:
            return []
        if len(items) > self.settings.max_items:
            raise ValidationError(f"more than {self.settings.max_items} {self.name} at once")
        if self._closed:
            raise BatcherClosedError(f"the {self.name} batcher is closed")
        lane = self._lane_for_running_loop()
        # A counter and an event rather than a semaphore: this runs for every message,
        # and the semaphore's bookkeeping was a visible share of the hub's ingest.
        while lane.inflight + len(items) > self.settings.max_waiting:
            lane.room.clear()
            await lane.room.wait()
        if self._closed:
            raise BatcherClosedError(f"the {self.name} batcher is closed")
        lane.inflight += len(items)
        try:
            future: asyncio.Future[list[Verdict]] = lane.loop.create_future()
            lane.queue.append(_Waiting(items, future, time.monotonic()))
            lane.queued += len(items)
            lane.ready.set()
            if lane.queued >= self.settings.max_items:
                lane.full.set()
            return await future
        finally:
            lane.inflight -= len(items)
            lane.room.set()

    async def close(self) -> None:
        """Write what is waiting, then stop; later submissions are refused.

        Closing twice, or a batcher never used, is fine.
        """
        self._closed = True
        lane = self._lane
        if lane is None or lane.task is None:
            return
        if lane.loop is not asyncio.get_running_loop():
            self._lane = None  # that loop is gone, and its waiters with it
            return
        lane.ready.set()
        lane.full.set()
        await lane.task

    def _lane_for_running_loop(self) -> _Lane[ItemT]:
        loop = asyncio.get_running_loop()
        lane = self._lane
        if lane is None or lane.loop is not loop or lane.task is None or lane.task.done():
            lane = _Lane(loop)
            lane.task = loop.create_task(self._flush_forever(lane), name=f"{self.name}-batcher")
            self._lane = lane
        return lane

    async def _flush_forever(self, lane: _Lane[ItemT]) -> None:
        try:
            while True:
                await lane.ready.wait()
                if not lane.queue:
                    if self._closed:
                        return
                    lane.ready.clear()
                    continue
                await self._wait_for_company(lane)
                batch = self._take(lane)
                if lane.queued < self.settings.max_items:
                    lane.full.clear()
                await self._flush(batch)
        finally:
            # Whatever ends the flusher, nobody may wait for it forever.
            for waiting in lane.queue:
                if not waiting.future.done():
                    waiting.future.set_exception(BatcherClosedError("the batcher stopped"))
            lane.queue.clear()
            lane.queued = 0

    def _take(self, lane: _Lane[ItemT]) -> list[_Waiting[ItemT]]:
        """The oldest submitters whose items fit in one batch (at least one)."""
        count = taken = 0
        for waiting in lane.queue:
            if taken and count + len(waiting.items) > self.settings.max_items:
                break
            count += len(waiting.items)
            taken += 1
        batch = lane.queue[:taken]
        del lane.queue[:taken]
        lane.queued -= count
        return batch

    async def _wait_for_company(self, lane: _Lane[ItemT]) -> None:
        if self._closed:
            return
        # Measured from the oldest item, so items that queued up during the
        # previous write are not held back a second time.
        left = lane.queue[0].since + self.settings.linger_s - time.monotonic()
        if left > 0 and not lane.full.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await lane.full.wait()

    async def _flush(self, batch: list[_Waiting[ItemT]]) -> None:
        items = [item for waiting in batch for item in waiting.items]
        try:
            results = await asyncio.to_thread(self._write_checked, items)
            if len(results) != len(items):
                raise StoreError(f"{len(results)} results for a batch of {len(items)}")
        except asyncio.CancelledError:
            for waiting in batch:
                waiting.future.cancel()
            raise
        except Exception as exc:  # handed to every waiter, who raises it
            for waiting in batch:
                if not waiting.future.done():
                    waiting.future.set_exception(exc)
            return
        self.batches += 1
        self.items += len(items)
        at = 0
        for waiting in batch:
            count = len(waiting.items)
            if not waiting.future.done():  # its submitter may have been cancelled
                waiting.future.set_result(results[at : at + count])
            at += count

    def _write_checked(self, items: list[ItemT]) -> list[Verdict]:
        """Write ``items``; when refused as malformed, write all but the bad ones (in a thread).

        Returns:
            Per item: stored (True), a duplicate (False), or why it was refused.
        """
        try:
            return list(self._write(items))
        except ValidationError:
            pass  # rare: find the bad items, so they alone are refused
        verdicts: list[Verdict] = []
        good: list[ItemT] = []
        for item in items:
            try:
                self._check(item)
            except ValidationError as exc:
                verdicts.append(exc)
                continue
            verdicts.append(True)
            good.append(item)
        written = list(self._write(good)) if good else []
        if len(written) != len(good):
            raise StoreError(f"{len(written)} results for a batch of {len(good)}")
        stored = iter(written)
        return [v if isinstance(v, ValidationError) else next(stored) for v in verdicts]


class TelemetryBatcher(GroupCommit[TelemetryItem]):
    """Telemetry windows of many devices in shared transactions.

    Args:
        write: ``Store.add_telemetry_windows``: True per stored window, False per duplicate.
        check: ``Store.check_telemetry_window``: raises ``ValidationError`` for a bad window.
        settings: Batch size, linger and caps.
    """

    def __init__(
        self,
        write: Callable[[Sequence[TelemetryItem]], list[bool]],
        check: Callable[[TelemetryItem], None],
        settings: BatcherSettings | None = None,
    ) -> None:
        super().__init__(write, check, settings, name="telemetry")

    async def submit(self, msg_id: str, device_id: str, record: TelemetryRecord) -> bool:
        """Store one window with the next batch; return once that batch committed.

        Returns:
            True when stored, False when the message id was stored before.

        Raises:
            ValidationError: The window is malformed or names another device; the
                others in its batch are stored all the same.
            BatcherClosedError: The batcher is closed.
            StoreError: The batch holding the window failed; nothing of it is stored.
        """
        return await self.submit_item(record_window(msg_id, device_id, record))

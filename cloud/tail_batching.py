"""Dynamic batching of tails across devices.

Requests for the same tail (skill, version, model, cut) share a **lane**. A
lane's batch goes to a worker when it holds ``max_batch`` requests, or when its
oldest request has waited ``max_wait_ms``, and only once a worker is free: while
every worker is busy the lanes keep filling, so the batch grows with the load.
ONNX Runtime runs in worker threads (``asyncio.to_thread``), never on the event
loop; at most ``workers`` batches run at once and at most ``max_queued``
requests wait, over all lanes; one more is refused at once (the caller answers
RESOURCE_EXHAUSTED) rather than queued past its deadline. A request whose
caller gave up (its deadline passed) before its batch left is not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

from cloud.tail_models import Feeds, TailModel

__all__ = ["BatchSettings", "Overloaded", "TailBatcher", "TailResult"]


class Overloaded(Exception):
    """Too many requests are waiting; this one was not queued."""


@dataclass(frozen=True)
class BatchSettings:
    """Batching and concurrency caps.

    Attributes:
        max_wait_ms: The longest a request waits for others to join its batch.
        max_batch: The most requests in one batch.
        max_queued: The most requests waiting for a worker, over all lanes.
        workers: Batches running at once (threads).
    """

    max_wait_ms: float = 2.0
    max_batch: int = 16
    max_queued: int = 256
    workers: int = 2

    def __post_init__(self) -> None:
        """Check the values.

        Raises:
            ValueError: A value is out of range.
        """
        if not 0.0 <= self.max_wait_ms <= 1000.0:
            raise ValueError("max_wait_ms must be in [0, 1000]")
        for name in ("max_batch", "max_queued", "workers"):
            if not 1 <= getattr(self, name) <= 100_000:
                raise ValueError(f"{name} must be in [1, 100000]")


@dataclass(frozen=True)
class TailResult:
    """One request's outputs and timings.

    Attributes:
        outputs: The tail's outputs for this request.
        queue_ms: From queueing to its batch starting.
        hub_ms: The batch's run time.
        batch: Requests in the batch.
    """

    outputs: Feeds
    queue_ms: float
    hub_ms: float
    batch: int


@dataclass(eq=False)  # compared by identity: the feeds are arrays
class _Waiting:
    feeds: Mapping[str, np.ndarray]
    future: asyncio.Future[TailResult]
    queued_at: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class _Lane:
    model: TailModel
    start: int
    waiting: list[_Waiting] = field(default_factory=list)
    full: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class TailBatcher:
    """Forms batches per tail and runs them in worker threads.

    Attributes:
        batch_sizes: How many batches ran with each number of requests.
        passes: ONNX Runtime passes (a batch that could not be batched counts one per request).
    """

    def __init__(self, settings: BatchSettings | None = None) -> None:
        self.settings = settings or BatchSettings()
        self._lanes: dict[Hashable, _Lane] = {}
        self._slots = asyncio.Semaphore(self.settings.workers)
        self._queued = 0
        self._running: set[asyncio.Task[None]] = set()
        self.batch_sizes: Counter[int] = Counter()
        self.passes = 0

    @property
    def queued(self) -> int:
        """Requests waiting for a worker."""
        return self._queued

    async def run(
        self, key: Hashable, model: TailModel, start: int, feeds: Mapping[str, np.ndarray]
    ) -> TailResult:
        """Run the tail of ``model`` from stage ``start`` on ``feeds``, batched with others.

        Cancelling the call (its deadline) withdraws the request if its batch has not left.

        Raises:
            Overloaded: ``max_queued`` requests are waiting already.
            TailLoadError: The tail refused this request's input.
        """
        if self._queued >= self.settings.max_queued:
            raise Overloaded(f"{self._queued} tail requests are waiting")
        lane = self._lanes.get(key)
        if lane is None or lane.model is not model:
            lane = self._lanes[key] = _Lane(model, start)
        waiting = _Waiting(feeds, asyncio.get_running_loop().create_future())
        lane.waiting.append(waiting)
        self._queued += 1
        if len(lane.waiting) >= self.settings.max_batch:
            lane.full.set()
        if lane.task is None or lane.task.done():
            lane.task = asyncio.create_task(self._drain(key, lane))
        try:
            return await waiting.future
        finally:
            # Withdrawn (cancelling this call cancels the future too): its batch has not left.
            waiting.future.cancel()
            if waiting in lane.waiting:
                lane.waiting.remove(waiting)
                self._queued -= 1

    async def _drain(self, key: Hashable, lane: _Lane) -> None:
        wait_s = self.settings.max_wait_ms / 1000.0
        while lane.waiting:
            oldest = lane.waiting[0].queued_at
            left = oldest + wait_s - time.monotonic()
            if left > 0 and len(lane.waiting) < self.settings.max_batch:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await lane.full.wait()
            await self._slots.acquire()
            batch = lane.waiting[: self.settings.max_batch]
            del lane.waiting[: len(batch)]
            self._queued -= len(batch)
            lane.full.clear()
            if len(lane.waiting) >= self.settings.max_batch:
                lane.full.set()
            live = [w for w in batch if not w.future.done()]
            if not live:
                self._slots.release()
                continue
            task = asyncio.create_task(self._run(lane, live))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        if self._lanes.get(key) is lane:
            del self._lanes[key]

    async def _run(self, lane: _Lane, batch: list[_Waiting]) -> None:
        started = time.monotonic()
        try:
            outputs, passes = await asyncio.to_thread(
                lane.model.run, lane.start, [w.feeds for w in batch]
            )
        except Exception as exc:  # the model refused: each request gets the error
            for waiting in batch:
                if not waiting.future.done():
                    waiting.future.set_exception(exc)
            return
        finally:
            self._slots.release()
        hub_ms = (time.monotonic() - started) * 1000.0
        self.batch_sizes[len(batch)] += 1
        self.passes += passes
        for waiting, out in zip(batch, outputs, strict=True):
            if waiting.future.done():
                continue
            if isinstance(out, Exception):
                waiting.future.set_exception(out)
            else:
                queue_ms = (started - waiting.queued_at) * 1000.0
                waiting.future.set_result(TailResult(out, queue_ms, hub_ms, len(batch)))

    async def close(self) -> None:
        """Stop forming batches; requests still waiting are cancelled."""
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        for lane in self._lanes.values():
            for waiting in lane.waiting:
                waiting.future.cancel()
        for task in [*tasks, *self._running]:
            task.cancel()
        await asyncio.gather(*tasks, *self._running, return_exceptions=True)
        self._lanes.clear()

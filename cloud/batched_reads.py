"""Reads asked for one key at a time, answered by one store call for many keys.

Thousands of device sessions each ask for their own desired state when the
notifier wakes them, which was one transaction per device. A
:class:`BatchedReads` takes the keys asked for in the same turn of the event
loop, and every key asked for while a read is running, and reads them with one
blocking call in a worker thread: the more callers wait, the larger the batch.
A caller waits no longer than one read ahead of its own.

A failed call fails every caller of that batch; a per-key failure (the
function returns the exception in that key's place) fails that key's callers
only. A caller that is cancelled leaves the read, and any other caller of the
same key, alone.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["BatchedReads"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

ReadMany = Callable[[list[K]], Mapping[K, V | Exception]]


@dataclass
class _Lane(Generic[K, V]):
    """The keys waiting on one event loop and the task that reads them."""

    waiting: dict[K, asyncio.Future[V]] = field(default_factory=dict)
    runner: asyncio.Task[None] | None = None


class BatchedReads(Generic[K, V]):
    """Coalesces single-key reads into calls of ``read_many``.

    Args:
        read_many: Blocking; given distinct keys, returns a value or an exception
            for each (a key left out fails with :class:`LookupError`). Runs in a
            worker thread.
        max_keys: Most keys per call; more wait for the next one.
    """

    def __init__(self, read_many: ReadMany[K, V], *, max_keys: int = 500) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, got {max_keys}")
        self._read_many = read_many
        self.max_keys = max_keys
        self._lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lane[K, V]] = (
            weakref.WeakKeyDictionary()
        )
        #: Calls of ``read_many`` so far, and the keys they read.
        self.calls = 0
        self.keys_read = 0

    async def get(self, key: K) -> V:
        """The value of ``key``, read together with the keys others ask for now.

        Raises:
            Exception: whatever ``read_many`` raised, or returned for ``key``.
        """
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(loop)
        if lane is None:
            lane = self._lanes[loop] = _Lane()
        future = lane.waiting.get(key)
        if future is None:
            future = lane.waiting[key] = loop.create_future()
            future.add_done_callback(_retrieve)
            if lane.runner is None or lane.runner.done():
                lane.runner = loop.create_task(self._run(lane), name="batched-reads")
        # Shielded: a cancelled caller must not cancel the answer others of the key await.
        return await asyncio.shield(future)

    async def _run(self, lane: _Lane[K, V]) -> None:
        try:
            while lane.waiting:
                await asyncio.sleep(0)  # callers of this turn of the loop join the batch
                await self._read_batch(lane)
        except BaseException:  # cancelled (the loop is closing): nobody waits forever
            for future in lane.waiting.values():
                future.cancel()
            lane.waiting.clear()
            raise

    async def _read_batch(self, lane: _Lane[K, V]) -> None:
        keys = list(lane.waiting)[: self.max_keys]
        futures = [lane.waiting.pop(k) for k in keys]
        self.calls += 1
        self.keys_read += len(keys)
        try:
            found = await asyncio.to_thread(self._read_many, keys)
        except Exception as exc:
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        for key, future in zip(keys, futures, strict=True):
            if future.done():
                continue
            value = found.get(key, _MISSING)
            if value is _MISSING:
                future.set_exception(LookupError(f"no value read for {key!r}"))
            elif isinstance(value, Exception):
                future.set_exception(value)
            else:
                future.set_result(value)  # type: ignore[arg-type]


_MISSING = object()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark an exception seen: every caller of the key may have been cancelled."""
    if not future.cancelled():
        future.exception()

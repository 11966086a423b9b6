"""Admission of fetches to the hub's serving slots: first come, first served, within caps.

A fetch that arrives while every slot is taken waits its turn in a bounded
queue instead of being refused; only a full queue, or a device that already
has its share of it waiting, is refused (told "busy", and asks again soon).
Refusing whenever the slots were full made every device ask again and again,
and a fleet's downloads progress together and end together; a queue serves
them in the order they came.

A request waits at most ``max_wait_s``: by then the agent that sent it has
given up on it or soon will (see :class:`edge_agent.transport.base.FetchLimits`),
so serving it would only cost the hub. Waiting requests past that age are
handed back (:meth:`FetchQueue.expired`) for the caller to answer "busy".

:class:`FetchQueue` does no I/O and starts nothing; :class:`FetchScheduler`
runs it on the event loop: it starts each request given a slot as a task,
starts the next when one ends, and refuses the expired ones on a timer.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["Admission", "FetchQueue", "FetchScheduler"]

T = TypeVar("T")


class Admission(enum.Enum):
    """What :meth:`FetchQueue.offer` did with a request."""

    START = "start"  #: a slot was free and is now the request's: start it
    QUEUED = "queued"  #: waiting for a slot
    QUEUE_FULL = "queue-full"  #: refused: the queue is at its cap
    DEVICE_FULL = "device-full"  #: refused: the device has its share of the queue waiting

    @property
    def refused(self) -> bool:
        """Whether the request was neither started nor queued."""
        return self in (Admission.QUEUE_FULL, Admission.DEVICE_FULL)


@dataclass(frozen=True, slots=True)
class _Waiting(Generic[T]):
    device: str
    item: T
    deadline: float


class FetchQueue(Generic[T]):
    """Serving slots and a bounded first-in, first-out queue of requests waiting for one.

    Args:
        slots: Requests served at once.
        max_queued: Requests waiting at once; more are refused.
        max_per_device: Requests of one device waiting at once; more are refused, so
            one device cannot fill the queue.
        max_wait_s: Longest wait; older requests are handed back by :meth:`expired`.
        clock: Seconds, monotonic.

    Raises:
        ValueError: a cap below its minimum (one slot, no negative caps or wait).
    """

    def __init__(
        self,
        slots: int,
        max_queued: int,
        max_per_device: int,
        max_wait_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if slots < 1 or max_queued < 0 or max_per_device < 0 or max_wait_s < 0:
            raise ValueError("fetch queue caps: slots >= 1, others >= 0")
        self.slots = slots
        self.max_queued = max_queued
        self.max_per_device = max_per_device
        self.max_wait_s = max_wait_s
        self.clock = clock
        self._running = 0
        self._waiting: deque[_Waiting[T]] = deque()
        self._per_device: dict[str, int] = {}

    @property
    def running(self) -> int:
        """Slots taken."""
        return self._running

    def __len__(self) -> int:
        """Requests waiting."""
        return len(self._waiting)

    def offer(self, device: str, item: T) -> Admission:
        """Take a slot for ``item`` if one is free and nothing waits, else queue it if allowed."""
        if self._running < self.slots and not self._waiting:
            self._running += 1
            return Admission.START
        if len(self._waiting) >= self.max_queued:
            return Admission.QUEUE_FULL
        queued = self._per_device.get(device, 0)
        if queued >= self.max_per_device:
            return Admission.DEVICE_FULL
        self._per_device[device] = queued + 1
        self._waiting.append(_Waiting(device, item, self.clock() + self.max_wait_s))
        return Admission.QUEUED

    def release(self) -> T | None:
        """A request ended and gave back its slot: the oldest waiting one gets it, if any.

        Call :meth:`expired` first, or a request past its wait may be handed the slot.

        Raises:
            RuntimeError: no slot was taken (a bug in the caller).
        """
        if self._running < 1:
            raise RuntimeError("released a fetch slot that was not taken")
        if not self._waiting:
            self._running -= 1
            return None
        return self._pop().item

    def expired(self) -> list[T]:
        """Remove and return the waiting requests past their wait, oldest first."""
        now = self.clock()
        stale = []
        # Every request waits as long, so the expired ones are the head of the queue.
        while self._waiting and self._waiting[0].deadline <= now:
            stale.append(self._pop().item)
        return stale

    def next_deadline(self) -> float | None:
        """When the oldest waiting request expires (on ``clock``), or None if none waits."""
        return self._waiting[0].deadline if self._waiting else None

    def clear(self) -> list[T]:
        """Remove and return every waiting request, oldest first (the server is stopping)."""
        items = [w.item for w in self._waiting]
        self._waiting.clear()
        self._per_device.clear()
        return items

    def _pop(self) -> _Waiting[T]:
        head = self._waiting.popleft()
        left = self._per_device[head.device] - 1
        if left:
            self._per_device[head.device] = left
        else:
            del self._per_device[head.device]
        return head


class FetchScheduler(Generic[T]):
    """Serves requests through a :class:`FetchQueue` on the running event loop.

    Args:
        queue: The slots and the waiting requests.
        serve: Serves one request (a task per request, holding a slot until it ends).
        refuse: Answers one request "busy" (refused, expired, or the scheduler closed).
    """

    def __init__(
        self,
        queue: FetchQueue[T],
        serve: Callable[[T], Coroutine[Any, Any, None]],
        refuse: Callable[[T], None],
    ) -> None:
        self.queue = queue
        self._serve, self._refuse = serve, refuse
        #: The requests being served.
        self.tasks: set[asyncio.Task[None]] = set()
        self._expiry: asyncio.TimerHandle | None = None
        self._closed = False

    def submit(self, device: str, item: T) -> Admission | None:
        """Start ``item`` now, queue it, or refuse it; call on the event loop.

        Returns:
            What the queue did with it; None when the scheduler is closed (refused).
        """
        if self._closed:
            self._refuse(item)
            return None
        admission = self.queue.offer(device, item)
        if admission is Admission.START:
            self._start(item)
        elif admission is Admission.QUEUED:
            self._arm_expiry()
        else:
            self._refuse(item)
        return admission

    def close(self) -> None:
        """Refuse the waiting requests and every later one; those being served go on."""
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        for item in self.queue.clear():
            self._refuse(item)

    def _start(self, item: T) -> None:
        task = asyncio.create_task(self._serve(item))
        self.tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A request gave back its slot: the oldest one still worth serving takes it."""
        self.tasks.discard(task)
        for stale in self.queue.expired():
            self._refuse(stale)
        item = self.queue.release()
        if item is not None:
            self._start(item)

    def _arm_expiry(self) -> None:
        deadline = self.queue.next_deadline()
        if self._expiry is None and deadline is not None:
            delay = max(0.0, deadline - self.queue.clock())
            self._expiry = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        """Refuse the requests past their wait even while no slot frees (all stuck)."""
        self._expiry = None
        for stale in self.queue.expired():
            self._refuse(stale)
        self._arm_expiry()

"""The agent's link to its current hub session, for code that runs on worker threads.

The TUF client downloads synchronously from a worker thread; :class:`HubLink`
carries each download over to the agent's event loop and whatever transport
is connected at that moment, and turns every failure into a ``FetchError``.
Several small files can go in one hop, all in flight together
(:meth:`HubLink.fetch_many`): each hop and each round trip adds to the time a
device takes to run a new version.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from edge_agent.errors import TransportError
from edge_agent.transport import AgentTransport
from skills.errors import FetchError

if TYPE_CHECKING:
    from skills.trust.client import FollowFn

__all__ = ["MAX_TRIPS", "HubLink"]

#: Trips one :meth:`HubLink.fetch_many` makes at most (a TUF refresh and its bundle: 4).
MAX_TRIPS = 6
_FETCH_TIMEOUT_S = 330.0  # the transports' 300 s deadline, plus margin; stalls end in 15 s


class HubLink:
    """The agent's current hub session, for code on worker threads (the TUF client).

    The TUF client fetches synchronously; :meth:`fetch` runs the download on
    the agent's event loop through whatever transport is connected now, and
    :meth:`fetch_many` several downloads at once.

    Args:
        max_bytes: Largest file fetched, whatever the caller asks for.
        timeout_s: Longest wait for one file.
    """

    def __init__(self, max_bytes: int, timeout_s: float = _FETCH_TIMEOUT_S) -> None:
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.transport: AgentTransport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, transport: AgentTransport) -> None:
        """Route fetches through ``transport``; call on the agent's event loop."""
        self._loop = asyncio.get_running_loop()
        self.transport = transport

    def detach(self) -> None:
        """The session ended: fetches fail until the next :meth:`attach`."""
        self.transport = None

    def fetch(self, path: str, max_bytes: int) -> bytes:
        """Fetch a hub file; call from a worker thread, never from the event loop.

        Raises:
            FileNotFoundError: the hub has no such file.
            FetchError: not connected, or the transfer failed or timed out.
        """
        transport, loop = self._connected()
        cap = min(max_bytes, self.max_bytes)
        future = asyncio.run_coroutine_threadsafe(transport.fetch(path, cap), loop)
        try:
            return future.result(self.timeout_s)
        except TransportError as exc:
            raise FetchError(str(exc)) from exc
        except TimeoutError as exc:
            future.cancel()
            raise FetchError(f"fetch of {path} timed out") from exc

    def fetch_many(
        self, requests: Sequence[tuple[str, int]], follow: FollowFn | None = None
    ) -> list[bytes | FetchError | None]:
        """Fetch several hub files at once, in one hop; call from a worker thread.

        Every file is in flight together, each capped as :meth:`fetch` caps it.
        With ``follow``, more trips follow on the event loop, still in the one hop:
        each trip's answers go to ``follow``, whose requests make the next trip
        (at most :data:`MAX_TRIPS` in all).

        Args:
            requests: ``(path, max_bytes)`` of each file.
            follow: Given a trip's answers, the next trip's requests (none: done);
                it runs on the event loop, so it must be quick and never raise.

        Returns:
            For each request in order, those of later trips after: the file, None
            when the hub has no such file, or the ``FetchError`` :meth:`fetch`
            would have raised for it.

        Raises:
            FetchError: not connected, or the files were not all in within the timeout.
        """
        transport, loop = self._connected()
        asks = [(path, min(max_bytes, self.max_bytes)) for path, max_bytes in requests]
        work = _fetch_trips(transport, asks, follow, self.max_bytes)
        future = asyncio.run_coroutine_threadsafe(work, loop)
        try:
            return future.result(self.timeout_s)
        except TimeoutError as exc:
            future.cancel()
            paths = ", ".join(path for path, _ in asks)
            raise FetchError(f"fetch of {paths} timed out") from exc

    def _connected(self) -> tuple[AgentTransport, asyncio.AbstractEventLoop]:
        transport, loop = self.transport, self._loop
        if transport is None or loop is None:
            raise FetchError("not connected to the hub")
        return transport, loop


async def _fetch_trips(
    transport: AgentTransport,
    asks: Sequence[tuple[str, int]],
    follow: FollowFn | None,
    max_bytes: int,
) -> list[bytes | FetchError | None]:
    answers: list[bytes | FetchError | None] = []
    for trips in range(1, MAX_TRIPS + 1):
        trip = await _fetch_all(transport, asks)
        answers += trip
        if follow is None or trips == MAX_TRIPS:
            break  # follow is asked only for a trip that will be made
        asks = [(path, min(cap, max_bytes)) for path, cap in follow(trip)]
        if not asks:
            break
    return answers


async def _fetch_all(
    transport: AgentTransport, asks: Sequence[tuple[str, int]]
) -> list[bytes | FetchError | None]:
    # Bounded as one fetch is: by each transport fetch's own deadline, and by the
    # caller's wait (fetch_many's timeout_s), which cancels this on expiry.
    tasks = [asyncio.ensure_future(_fetch_one(transport, path, cap)) for path, cap in asks]
    try:
        return await asyncio.gather(*tasks)
    finally:
        # Cancelled, or one failed unexpectedly: the others end with it.
        for task in tasks:
            task.cancel()


async def _fetch_one(transport: AgentTransport, path: str, cap: int) -> bytes | FetchError | None:
    try:
        return await transport.fetch(path, cap)
    except FileNotFoundError:
        return None
    except TransportError as exc:
        return FetchError(str(exc))

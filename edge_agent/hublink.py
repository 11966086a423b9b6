"""The agent's link to its current hub session, for code that runs on worker threads.

The TUF client downloads synchronously from a worker thread; :class:`HubLink`
carries each download over to the agent's event loop and whatever transport
is connected at that moment, and turns every failure into a ``FetchError``.
"""

from __future__ import annotations

import asyncio

from edge_agent.errors import TransportError
from edge_agent.transport import AgentTransport
from skills.errors import FetchError

__all__ = ["HubLink"]

_FETCH_TIMEOUT_S = 330.0  # the transports' 300 s deadline, plus margin; stalls end in 15 s


class HubLink:
    """The agent's current hub session, for code on worker threads (the TUF client).

    The TUF client fetches synchronously; :meth:`fetch` runs the download on
    the agent's event loop through whatever transport is connected now.

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
        transport, loop = self.transport, self._loop
        if transport is None or loop is None:
            raise FetchError("not connected to the hub")
        cap = min(max_bytes, self.max_bytes)
        future = asyncio.run_coroutine_threadsafe(transport.fetch(path, cap), loop)
        try:
            return future.result(self.timeout_s)
        except TransportError as exc:
            raise FetchError(str(exc)) from exc
        except TimeoutError as exc:
            future.cancel()
            raise FetchError(f"fetch of {path} timed out") from exc

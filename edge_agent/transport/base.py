"""The transport interface the agent talks to its hub through.

Implementations (gRPC, MQTT) write the few abstract methods; this base turns
bulk fetches into one capped, deadline-bounded, resumable download, the way
python-tuf's ``FetcherInterface`` wraps ``_fetch``.
"""

from __future__ import annotations

import asyncio
import random
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass

from edge_agent.errors import TransportError
from protos import pb


@dataclass(frozen=True)
class FetchLimits:
    """Bounds on one bulk fetch, so a slow, stalled or endless sender cannot hold the agent.

    Attributes:
        deadline_s: Longest time for the whole file.
        min_rate_bytes_per_s: Slowest average rate accepted once ``grace_s`` has passed.
        grace_s: How long the minimum rate is not checked.
        max_resumes: Broken transfers resumed before giving up.
        chunk_timeout_s: Stall bound: no data for this long means the hub is stalled, and
            the fetch fails at once (asking a stalled hub again would only wait again).
    """

    deadline_s: float = 300.0
    min_rate_bytes_per_s: float = 16 * 1024
    grace_s: float = 10.0
    max_resumes: int = 5
    chunk_timeout_s: float = 15.0


class FetchAborted(TransportError):
    """A fetch broke a cap (size, rate); resuming would not help."""


class FetchBusy(TransportError):
    """The hub is serving as many fetches as it allows; asking again soon will do."""


def _check_progress(
    path: str, received: int, max_bytes: int, started: float, limits: FetchLimits
) -> None:
    """Refuse a fetch over its size cap, or slower than its minimum rate after the grace."""
    if received > max_bytes:
        raise FetchAborted(f"{path} is larger than the {max_bytes} byte cap")
    elapsed = time.monotonic() - started
    if elapsed > limits.grace_s and received / elapsed < limits.min_rate_bytes_per_s:
        raise FetchAborted(f"{path} arrives slower than {limits.min_rate_bytes_per_s:.0f} B/s")


class AgentTransport(ABC):
    """One agent's connection to its hub. Use as an async context manager."""

    #: Set by implementations from the hub URL, for logs.
    url: str = ""
    #: Bounds of every fetch that names none; the defaults of :class:`FetchLimits` if unset.
    fetch_limits: FetchLimits | None = None

    @abstractmethod
    async def connect(self, register: pb.Envelope) -> None:
        """Open the connection and send the ``register`` envelope first.

        Raises:
            TransportError: the hub cannot be reached.
        """

    @abstractmethod
    async def send(self, env: pb.Envelope) -> None:
        """Send one envelope to the hub.

        Raises:
            TransportError: the connection is gone.
        """

    @abstractmethod
    async def receive(self) -> pb.Envelope:
        """Wait for the next envelope from the hub.

        Raises:
            TransportError: the connection is gone.
        """

    @abstractmethod
    def _fetch(self, path: str, offset: int, max_bytes: int) -> AsyncIterator[bytes]:
        """Stream a hub file from ``offset``.

        Raises:
            FileNotFoundError: the hub has no such file.
            TransportError: the connection failed or the hub refused.
        """

    @abstractmethod
    async def close(self) -> None:
        """Close the connection; safe to call twice."""

    async def infer_tail(self, request: pb.InferRequest, timeout_s: float) -> pb.InferResponse:
        """Have the hub run the tail of a split model (or a joint pair's big model).

        The hub names the device by this connection, never by the request. Not
        abstract, so transports made before split inference still load; those
        that serve it (gRPC, MQTT) override it.

        Args:
            request: What to run, with the tensors at the cut and a ``request_id``
                (a resend with the same id gets the same answer, not a second run).
            timeout_s: How long to wait for the answer.

        Raises:
            InferRefusedError: The hub refused the request (unknown skill, model or
                cut, not entitled, malformed, over a cap, overloaded).
            TransportError: The link failed, no answer came within ``timeout_s``,
                the answer was over a cap, or this transport cannot carry it.
        """
        del request, timeout_s
        raise TransportError(f"{type(self).__name__} does not carry split inference")

    async def __aenter__(self) -> AgentTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def fetch(self, path: str, max_bytes: int, limits: FetchLimits | None = None) -> bytes:
        """Download a whole hub file, resuming after interruptions.

        Raises:
            FileNotFoundError: the hub has no such file.
            TransportError: over ``max_bytes``, past the deadline, below the
                minimum rate, or failed more than ``max_resumes`` times.
        """
        limits = limits or self.fetch_limits or FetchLimits()
        buf = bytearray()
        started = time.monotonic()
        failures = 0
        while True:
            try:
                await self._fetch_into(buf, path, max_bytes, started, limits)
                return bytes(buf)
            except FetchAborted:
                raise
            except FetchBusy:  # not a failure: wait a moment (jittered, so askers spread out)
                await asyncio.sleep(random.uniform(0.2, 1.0))
            except TransportError:
                failures += 1
                if failures > limits.max_resumes:
                    raise
                await asyncio.sleep(min(2.0, 0.2 * failures))

    async def _fetch_into(
        self, buf: bytearray, path: str, max_bytes: int, started: float, limits: FetchLimits
    ) -> None:
        """Read the rest of ``path`` into ``buf``, bounded by the deadline and the stall bound.

        One timer keeps both: before each chunk it is set to the nearer of the
        deadline and the stall bound, and which one ran out says what went wrong.
        (A timer a chunk inside one for the whole fetch were over a quarter of what
        a small fetch cost an agent; and in Python 3.11, nested ``wait_for`` could
        swallow the outer deadline's cancellation when a chunk arrived at the same
        moment.)
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, limits.deadline_s - (time.monotonic() - started))
        stream = self._fetch(path, len(buf), max_bytes)
        try:
            async with asyncio.timeout(None) as window:
                while True:
                    window.reschedule(min(deadline, loop.time() + limits.chunk_timeout_s))
                    try:
                        chunk = await anext(stream)
                    except StopAsyncIteration:
                        return
                    buf += chunk
                    _check_progress(path, len(buf), max_bytes, started, limits)
        except TimeoutError as exc:
            if loop.time() >= deadline:  # not resumed: the time is spent
                raise FetchAborted(
                    f"fetch of {path} passed its {limits.deadline_s:.0f} s deadline"
                ) from exc
            raise FetchAborted(
                f"the hub stalled: no data for {path} in {limits.chunk_timeout_s:g} s"
            ) from exc

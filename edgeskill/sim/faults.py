"""Fault injection around a real transport: dropped connections and slow links.

:class:`FaultyTransport` wraps the agent's own transport (gRPC or MQTT) and
keeps its behaviour, adding a delay to every message and fetched chunk
(``slow_link_ms``) and cutting the session at random (``disconnect_rate``
per minute, exponentially spaced), as a flaky cellular link would. The agent
sees an ordinary :class:`~edge_agent.errors.TransportError` and reconnects
through its usual backoff. Skill crashes are the runtime's
(:mod:`edgeskill.sim.runtime`).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from edge_agent.agent import TransportFactory
from edge_agent.errors import TransportError
from edge_agent.transport import AgentTransport
from edge_agent.transport.base import FetchBusy
from protos import pb

__all__ = ["FaultCounters", "FaultyTransport", "faulty_factory"]


@dataclass
class FaultCounters:
    """What the faults did, over every agent of one worker."""

    disconnects: int = 0
    sessions: int = 0
    connected: int = 0
    #: Fetch requests sent (each resume and each ask after "busy" is one more).
    fetches: int = 0
    #: Of those, the ones the hub answered "busy" (its fetch queue was full or too slow).
    fetch_busy: int = 0


class FaultyTransport(AgentTransport):
    """A transport that is ``inner`` with a slow link and random disconnections.

    Args:
        inner: The real transport.
        counters: Where sessions and injected disconnections are counted.
        rng: The random draws of this device.
        disconnect_rate: Disconnections per minute while connected (0: none).
        slow_link_ms: Delay added to each message sent or received and each fetched chunk.
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        inner: AgentTransport,
        counters: FaultCounters,
        rng: random.Random,
        *,
        disconnect_rate: float = 0.0,
        slow_link_ms: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self.fetch_limits = inner.fetch_limits
        self._counters = counters
        self._rng = rng
        self._rate = disconnect_rate
        self._delay_s = slow_link_ms / 1000.0
        self._clock = clock
        self._drops_at = math.inf
        self._open = False

    async def _lag(self) -> None:
        if self._delay_s > 0:
            await asyncio.sleep(self._delay_s)

    async def connect(self, register: pb.Envelope) -> None:
        """Connect through the slow link; the next disconnection is drawn now.

        Raises:
            TransportError: the hub cannot be reached.
        """
        await self._lag()
        await self.inner.connect(register)
        self._open = True
        self._counters.sessions += 1
        self._counters.connected += 1
        if self._rate > 0:
            self._drops_at = self._clock() + self._rng.expovariate(self._rate / 60.0)

    async def send(self, env: pb.Envelope) -> None:
        """Send after the link's delay.

        Raises:
            TransportError: the connection is gone (or was cut).
        """
        self._check_cut()
        await self._lag()
        await self.inner.send(env)

    async def receive(self) -> pb.Envelope:
        """The next envelope, after the link's delay, unless the link is cut first.

        Raises:
            TransportError: the connection is gone, or the simulated cut came.
        """
        wait = self._drops_at - self._clock()
        if math.isinf(wait):
            env = await self.inner.receive()
        else:
            try:
                async with asyncio.timeout(max(0.0, wait)):
                    env = await self.inner.receive()
            except TimeoutError:
                self._drops_at = math.inf
                self._counters.disconnects += 1
                raise TransportError("simulated disconnect") from None
        await self._lag()
        return env

    def _check_cut(self) -> None:
        if self._clock() >= self._drops_at:
            self._drops_at = math.inf
            self._counters.disconnects += 1
            raise TransportError("simulated disconnect")

    async def _fetch(self, path: str, offset: int, max_bytes: int) -> AsyncIterator[bytes]:
        self._counters.fetches += 1
        try:
            async for chunk in self.inner._fetch(path, offset, max_bytes):
                await self._lag()
                yield chunk
        except FetchBusy:
            self._counters.fetch_busy += 1
            raise

    async def infer_tail(self, request: pb.InferRequest, timeout_s: float) -> pb.InferResponse:
        """The real transport's, behind the slow link both ways.

        Raises:
            TransportError: As the real transport's.
        """
        await self._lag()
        response = await self.inner.infer_tail(request, timeout_s)
        await self._lag()
        return response

    async def close(self) -> None:
        """Close the real transport; safe to call twice."""
        if self._open:
            self._open = False
            self._counters.connected -= 1
        await self.inner.close()


def faulty_factory(
    factory: TransportFactory,
    counters: FaultCounters,
    rng: random.Random,
    *,
    disconnect_rate: float,
    slow_link_ms: float,
) -> TransportFactory:
    """A transport factory whose every session goes through :class:`FaultyTransport`."""

    def make() -> AgentTransport:
        return FaultyTransport(
            factory(),
            counters,
            rng,
            disconnect_rate=disconnect_rate,
            slow_link_ms=slow_link_ms,
        )

    return make

"""A transport whose fetches follow a script, for testing the base class's caps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from edge_agent.errors import TransportError
from edge_agent.transport.base import AgentTransport, FetchBusy
from protos import pb


class ScriptedTransport(AgentTransport):
    """Serves ``data`` in ``chunk``-byte pieces ``delay_s`` apart; fails once at ``fail_after``.

    The first ``busy`` requests are answered "busy", as a hub with every fetch slot taken does.
    """

    def __init__(
        self,
        data: bytes,
        chunk: int = 1024,
        delay_s: float = 0.0,
        fail_after: int | None = None,
        busy: int = 0,
    ) -> None:
        self.busy = busy
        self.data = data
        self.chunk = chunk
        self.delay_s = delay_s
        self.fail_after = fail_after
        self.offsets: list[int] = []

    async def connect(self, register: pb.Envelope) -> None:
        return None

    async def send(self, env: pb.Envelope) -> None:
        return None

    async def receive(self) -> pb.Envelope:
        await asyncio.sleep(3600)
        raise TransportError("closed")

    async def _fetch(self, path: str, offset: int, max_bytes: int) -> AsyncIterator[bytes]:
        if path.endswith("missing"):
            raise FileNotFoundError(path)
        self.offsets.append(offset)
        if self.busy > 0:
            self.busy -= 1
            raise FetchBusy("the hub is busy")
        pos = offset
        while pos < len(self.data):
            if self.fail_after is not None and pos >= self.fail_after:
                self.fail_after = None
                raise TransportError("connection reset")
            await asyncio.sleep(self.delay_s)
            yield self.data[pos : pos + self.chunk]
            pos += self.chunk

    async def close(self) -> None:
        return None

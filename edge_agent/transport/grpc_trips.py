"""Trips of fetches over gRPC in one ``FetchMany`` call, instead of a ``Fetch`` call a file.

A TUF refresh and its bundle are four or five small files over as many trips;
each call costs the hub far more than the bytes it carries. One ``FetchMany``
call carries them all: a ``FetchBatch`` a trip, answered file by file, in order.

Everything the hub sends is checked as a lone fetch checks it (each file's cap,
the deadline, the stall bound, the minimum rate) and the order of the parts
too. A file the call does not answer (the hub is busy, does not know the
device yet, is too old to serve the call, or the call broke) is fetched on its
own, as before; so is every file of the later trips once the call has broken.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence

import grpc
import grpc.aio

from edge_agent.errors import TransportError
from edge_agent.transport.base import (
    AgentTransport,
    FetchAborted,
    FetchAnswer,
    FetchLimits,
    FetchTrips,
    check_progress,
    fetch_each,
)
from protos import edgeskill_pb2_grpc as pb_grpc
from protos import pb
from protos.fetch import MAX_FETCH_BATCH_FILES, FetchErrorCode

__all__ = ["GrpcFetchTrips"]

#: The longest refusal text of the hub's kept in an error.
_MAX_DETAIL_CHARS = 200


class _Unanswered:
    """A file the call left unanswered: it is fetched on its own."""


_UNANSWERED = _Unanswered()


class GrpcFetchTrips(FetchTrips):
    """Trips of fetches in one ``FetchMany`` call on ``channel``.

    Args:
        transport: Fetches what the call leaves unanswered, each file on its own.
        channel: The connected channel the call is made on.
        device_id: The device the batches name (the hub checks it against the certificate).
        unserved: Called when the hub said it does not serve ``FetchMany`` (an older
            hub); its refusal races the first batch and may come as an internal error
            instead, and then the next hop asks again.
    """

    def __init__(
        self,
        transport: AgentTransport,
        channel: grpc.aio.Channel,
        device_id: str,
        unserved: Callable[[], None],
    ) -> None:
        super().__init__(transport)
        self._channel = channel
        self._device_id = device_id
        self._unserved = unserved
        self._call: grpc.aio.StreamStreamCall | None = None
        # Batches go through a queue the call reads, not call.write: a write to a
        # call the hub refused fails with an internal error instead of the refusal.
        self._batches: asyncio.Queue[pb.FetchBatch | None] = asyncio.Queue()
        self._broken = False

    async def trip(self, asks: Sequence[tuple[str, int]]) -> list[FetchAnswer]:
        """Fetch ``(path, max_bytes)`` of each file in the call; the answers in the order asked."""
        answers: list[FetchAnswer | _Unanswered] = [_UNANSWERED] * len(asks)
        if not self._broken and 0 < len(asks) <= MAX_FETCH_BATCH_FILES:
            try:
                await self._ask(asks, answers)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self._unserved()
                self._break()
            except (TransportError, TimeoutError):
                self._break()
        missing = [i for i, answer in enumerate(answers) if answer is _UNANSWERED]
        if missing:
            alone = await fetch_each(self.transport, [asks[i] for i in missing])
            for i, answer in zip(missing, alone, strict=True):
                answers[i] = answer
        return [answer for answer in answers if not isinstance(answer, _Unanswered)]

    async def aclose(self) -> None:
        """End the call; safe to call twice."""
        self._break()

    def _break(self) -> None:
        self._broken = True
        self._batches.put_nowait(None)
        if self._call is not None:
            self._call.cancel()
            self._call = None

    async def _requests(self) -> AsyncIterator[pb.FetchBatch]:
        while (batch := await self._batches.get()) is not None:
            yield batch

    async def _ask(
        self, asks: Sequence[tuple[str, int]], answers: list[FetchAnswer | _Unanswered]
    ) -> None:
        """Send one batch and read its answers into ``answers``, one file after another.

        Raises:
            TransportError: The hub broke the call's order or a cap (the file at fault
                answered with :class:`FetchAborted` where a lone fetch would have been).
            TimeoutError: Past the deadline, or no part within the stall bound.
            grpc.aio.AioRpcError: The call failed.
        """
        if self._call is None:
            self._call = pb_grpc.HubStub(self._channel).FetchMany(self._requests())
        call = self._call
        limits = self.transport.fetch_limits or FetchLimits()
        loop = asyncio.get_running_loop()
        started, deadline = time.monotonic(), loop.time() + limits.deadline_s
        requests = [pb.FetchRequest(path=path, max_bytes=cap) for path, cap in asks]
        index, buf = 0, bytearray()
        async with asyncio.timeout(None) as window:
            window.reschedule(min(deadline, loop.time() + limits.chunk_timeout_s))
            self._batches.put_nowait(pb.FetchBatch(device_id=self._device_id, requests=requests))
            while index < len(asks):
                window.reschedule(min(deadline, loop.time() + limits.chunk_timeout_s))
                part = await call.read()
                if part is grpc.aio.EOF:
                    raise TransportError("the hub ended a batched fetch before its answers")
                if part.index != index:
                    raise TransportError(f"the hub answered file {part.index}, not {index}")
                path, cap = asks[index]
                if part.error_code:
                    answers[index] = _refusal(path, part)
                elif not _take(path, cap, part.chunk, buf, started, limits, answers, index):
                    continue
                index, buf = index + 1, bytearray()


def _take(
    path: str,
    cap: int,
    chunk: pb.FetchChunk,
    buf: bytearray,
    started: float,
    limits: FetchLimits,
    answers: list[FetchAnswer | _Unanswered],
    index: int,
) -> bool:
    """Add ``chunk`` to ``buf``; whether it was the file's last (then its answer is set).

    Raises:
        TransportError: the chunk is out of order, over a cap, or the size does not
            add up (a cap or the rate broken: the file's answer is the :class:`FetchAborted`).
    """
    if chunk.offset != len(buf):
        raise TransportError(f"{path}: a chunk at {chunk.offset}, expected {len(buf)}")
    buf += chunk.data
    try:
        if chunk.total_size > cap:
            raise FetchAborted(f"{path} is larger than the {cap} byte cap")
        check_progress(path, len(buf), cap, started, limits)
    except FetchAborted as exc:
        answers[index] = exc
        raise
    if not chunk.last:
        return False
    if len(buf) != chunk.total_size:
        raise TransportError(f"{path}: {len(buf)} bytes, but the hub said {chunk.total_size}")
    answers[index] = bytes(buf)
    return True


def _refusal(path: str, part: pb.FetchPart) -> FetchAnswer | _Unanswered:
    """A refused file's answer: None (no such file), final, or asked again on its own.

    Raises:
        TransportError: the code is none of the wire's.
    """
    try:
        code = FetchErrorCode(part.error_code)
    except ValueError as exc:
        raise TransportError(f"{path}: an unknown refusal {part.error_code[:32]!r}") from exc
    if code is FetchErrorCode.NOT_FOUND:
        return None
    if code.final:
        detail = part.error_message[:_MAX_DETAIL_CHARS]
        return FetchAborted(f"fetch of {path} refused: {code} {detail}")
    return _UNANSWERED
